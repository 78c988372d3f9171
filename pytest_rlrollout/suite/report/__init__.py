"""The run's report, in layers (import-linter holds them, pyproject.toml):

- `model`: the typed records (`Report`, `ClauseResult`, `TestResult`, ...) with `to_json` and
  `from_json`; no writer, nothing of pytest.
- `text`, `timeline`, `pictures`: the model worded, drawn and pictured once for every writer.
- `markdown`, `html` (templates/): one writer per format, reading the model's attributes.
- `files`: the one place that touches the disk (`write`, `paths`), the JSON writer beside it.

The pytest side (`suite.reporting`) fills the model from test reports and calls `files.write`.
"""
