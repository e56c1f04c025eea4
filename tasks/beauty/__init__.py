"""The Beauty Index (issue 9): study definition, suite, analysis."""
