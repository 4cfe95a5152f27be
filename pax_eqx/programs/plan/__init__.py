"""Planning without devices: the dry run's sharding and memory plan (`dry_run`), the layout
search of `--dry-run --recommend` (`recommend`), and their flags (`plan_flags`). The accelerators
they price are hardware facts one floor down: pax_eqx.sharding.device_kinds.
"""
