"""Read-only checks of a GPU machine: gather facts (probe), judge them (checks), render a report."""

TOOL_NAME = "gpu-preflight"
TOOL_VERSION = "0.1.0"
