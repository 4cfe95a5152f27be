"""Planning without devices: the dry run's sharding and memory plan (`dry_run`), the layout
search of `--dry-run --recommend` (`recommend`) and the accelerators it prices (`device_kinds`).
"""
