"""The conformance suite: the pytest plugin, its options and fixtures, the report, and the
conformance tests (`conformance/`) with recorded runs to replay (`cassettes/`)."""
