"""Named experiments. Every module here is imported by the registry (pax_eqx.command_line.registry)
through the `pax_eqx.experiments` entry point in pyproject.toml, so its @register functions are
found by `--exp NAME` without listing the module anywhere."""
