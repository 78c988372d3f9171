"""DIAGNOSE — where a gap between the trainer's logprobs and the deployment's comes from.

Not a conformance module: it judges no clause, and no conformance run collects it (its name is
not `test_*.py`). `rlrollout diagnose` runs it, with the trainer's numbers (`--snapshot DIR` or
`--expected FILE`) in the session's plugin; the deployment is the run's `rl_deployment`, reached
as every conformance run reaches it (the bundled reference deployment by default, a live one by
the suite's options, or a recording). The diagnosis is the command's output and exit status, and
the diagnosis section of the run's report (`--rl-report`).
"""

import pytest

COMMAND = "rlrollout-diagnose"  # the plugin `rlrollout diagnose` gives the session


def test_diagnose(rl_deployment, request):
    """Every cause measured on its own, the others held still: the weights (each replica scores
    the canary fresh, uncached and alone), the prompt cache, batching and the decode path; what
    remains is the numerics of the served precision. The test fails only when the diagnosis
    cannot be made; what it finds is the command's to judge."""
    diagnosing = request.config.pluginmanager.get_plugin(COMMAND)
    if diagnosing is None:
        pytest.fail(
            "conformance/diagnose.py is run by `rlrollout diagnose --snapshot DIR` (or `--expected FILE`), "
            "which gives it the trainer's numbers",
            pytrace=False,
        )
    diagnosing.diagnose(rl_deployment, request.node)
