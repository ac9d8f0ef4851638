"""The claims audit's plumbing (the full run, ~1 min, is `python -m poolsim.audit`, not a test)."""
import os
import pathlib

import pytest

import poolsim
from poolsim import audit

ROOT = pathlib.Path(__file__).resolve().parents[1]
# the numbered claims issue 5 asks the audit to cover (one row or more each)
REQUIRED = ["Thm 1(a)", "Thm 1(b)", "Thm 1(c)", "Thm 2(a)", "Thm 2(b)", "Thm 2(c)", "Thm 3(1)",
            "Thm 3(2)", "Thm 3(3)", "Table 'theoretical_comparison'", "Corollary 'optimal tau'",
            "Corollary exchangeability", "Example 1", "Thm 4(1)", "Thm 4(2)", "Thm 4(3)", "Thm 4(4)",
            "Lemma (multimodal reduction)", "Matched-set property 1", "Matched-set property 2",
            "Matched-set property 3", "Matched-set property 4", "'Double robustness'",
            # issue 11: the paper's set-ups against its premises, the Corollary's conclusion
            "Assumption 2(a) E mu_k = mu*", "Positivity (Sec. 5)",
            "Corollary 'optimal tau', conclusion", "Thm 2(a),(b) need only E mu = mu*",
            "Thm 2 takeaway"]
VERDICTS = ("holds", "does not hold", "inconclusive")  # no placeholder rows


def test_committed_claims_file_covers_every_claim_with_a_verdict():
    text = (ROOT / "docs" / "claims.md").read_text().split("\n## ", 1)[0]  # the audit's table
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    for claim in REQUIRED:
        hits = [r for r in rows if r.startswith(f"| {claim}")]
        assert hits, claim
        for r in hits:
            verdict = r.rstrip(" |").rsplit(" | ", 1)[1]
            assert verdict.startswith(VERDICTS), (claim, verdict)


def test_render_escapes_pipes_and_write_is_atomic(tmp_path):
    rows = [audit.Row("claim |x|", "checked", "1 [0, 2]", "holds", audit.MC)]
    text = audit.render(rows, seeds=20)
    assert f"| claim \\|x\\| | checked | 1 [0, 2] | {audit.MC} | holds |" in text
    out = tmp_path / "sub" / "claims.md"
    poolsim.io.atomic_write_text(str(out), text)
    assert out.read_text() == text
    assert os.listdir(out.parent) == ["claims.md"]  # no temp file left behind
    assert out.stat().st_mode & 0o777 == 0o666 & ~_umask()  # usual permissions, not mkstemp's 0600


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_every_kind_of_evidence_is_named_and_identities_are_not_counted():
    text = (ROOT / "docs" / "claims.md").read_text().split("\n## ", 1)[0]  # the audit's table
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    kinds = [r.rstrip(" |").rsplit(" | ", 2)[1] for r in rows]
    assert all(k.startswith(tuple(x[:20] for x in audit.KINDS)) for k in kinds)
    n = sum(k.startswith(audit.NOT_EVIDENCE[:20]) for k in kinds)
    assert 0 < n < len(rows) and f"{n} of {len(rows)} rows" in text


def test_cli_rejects_too_few_seeds_and_has_help(capsys):
    with pytest.raises(SystemExit) as e:
        audit.main(["--seeds", "3"])
    assert e.value.code == 2 and "--seeds" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        audit.main(["--help"])
    assert e.value.code == 0 and "--out" in capsys.readouterr().out
