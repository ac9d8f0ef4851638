"""A real backbone with random weights is never built by default: every command and ``Detector.zero_shot``
stop before any work, in one line naming ``--checkpoint`` (``checkpoint=``), unless ``--random-weights``
(``random_weights=True``) or the tiny test backbone asks for them (``adsim.config.choices.require_weights``).
Only the refusals run here (no backbone is built); the tiny backbone's runs are tested everywhere else."""
import pytest

from adsim.cli.main import _check_weights, _parser, main
from adsim.inference.detector import Detector

REFUSAL = ("error: backbone ViT-L-14-336 without --checkpoint would have RANDOM weights and meaningless scores: give "
           "--checkpoint PATH (local weights, e.g. ViT-L-14-336px.pt), or --random-weights for a test or timing run "
           "(--backbone tiny is the small random test backbone)")


def _commands(data, out):
    return {"predict": ["predict", "--zero-shot", "winclip", str(data), "--out", str(out)],
            "eval": ["eval", "--zero-shot", "winclip", "--data", str(data), "--target", "Brain", "--out", str(out)],
            "train": ["train", "--data", str(data), "--target", "Brain", "--out", str(out)],
            "table": ["table", "--data", str(data), "--methods", "winclip", "naive", "--out", str(out)],
            "protocol": ["protocol", "--data", str(data), "--out", str(out)]}


@pytest.mark.parametrize("command", ["predict", "eval", "train", "table", "protocol"])
def test_every_command_refuses_a_random_vit_l_in_one_line_before_any_work(toy_root, tmp_path, capsys, command):
    out = tmp_path / "out"
    argv = _commands(toy_root, out)[command]
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [REFUSAL]
    assert not out.exists()
    # asked for: the check passes (the run itself is the tiny backbone's tests' business)
    assert _check_weights(_parser().parse_args([*argv, "--random-weights"])) is None
    assert _check_weights(_parser().parse_args([*argv, "--backbone", "tiny"])) is None
    assert main([*argv, "--random-weights", "--checkpoint", str(tmp_path / "w.pt")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --checkpoint loads weights and --random-weights asks for random ones: give one of them"]


@pytest.mark.parametrize("argv, where", [
    (["predict", "--run", "RUN", "IMG", "--out", "O", "--random-weights"], "--zero-shot"),
    (["eval", "--run", "RUN", "--data", "D", "--random-weights"], "--zero-shot"),
    (["protocol", "--simulate", "--out", "O", "--random-weights"], "--data"),
])
def test_random_weights_without_a_backbone_to_build_is_an_error(argv, where, capsys):
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: --random-weights goes with {where} (")


def test_detector_zero_shot_asks_for_random_weights_the_python_way():
    with pytest.raises(ValueError, match=r"^backbone ViT-L-14-336 without checkpoint would have RANDOM weights .*"
                                         r"give checkpoint=PATH .* or random_weights=True .*backbone='tiny'"):
        Detector.zero_shot("winclip")
    with pytest.raises(ValueError, match="checkpoint loads weights and random_weights=True asks for random ones"):
        Detector.zero_shot("winclip", backbone="ViT-B-16", checkpoint="w.pt", random_weights=True)
