"""The model: frozen open_clip backbone, adapter head with VACA and text scoring, centroid matching
(``poolsim``'s core on torch, with its gate kernels), losses and the training objective.
"""
import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=['backbone', 'gate_triton', 'head', 'losses', 'matching', 'objective', 'prompting', 'sphere'],
    submod_attrs={
        'backbone': ['Backbone', 'BackboneSpec', 'RandomWeightsWarning', 'build_backbone', 'fingerprint', 'run_blocks', 'upsample_patches'],
        'head': ['VACA', 'Features', 'Head', 'anomaly_maps', 'features', 'features_from_bottlenecks', 'features_from_tokens', 'image_scores', 'make_head', 'text_embeddings', 'trunk_tokens'],
        'matching': ['CentroidBank', 'Matched', 'match', 'match_sequential'],
        'objective': ['matching_losses', 'objective'],
        'prompting': ['encode_text_deep', 'pooled_length', 'run_prompted_blocks'],
    },
)
