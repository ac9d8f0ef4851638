"""Configuration: recipes (one frozen dataclass each), the run configuration and its one validation,
named choices and prompt sets. Plain Python: importing it loads neither torch nor open_clip.
"""
import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=['choices', 'prompts', 'recipes', 'run'],
    submod_attrs={
        'recipes': ['CHOICES', 'FIELDS', 'RECIPES', 'Recipe'],
        'run': ['TrainConfig', 'config_from_recipe', 'recipe_of', 'train_domains_of', 'validate'],
        'choices': ['BACKBONES', 'TEST_BACKBONE', 'require_weights', 'COMPILE_CHOICES', 'DEFAULT_COMPILE', 'DEFAULT_SCORE', 'METRICS', 'MODES', 'SCORES', 'ZERO_SHOT_METHODS'],
        'prompts': ['PROMPT_SETS', 'prompt_ensemble', 'prompt_texts'],
    },
)
