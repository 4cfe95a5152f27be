"""The job: what a run keeps in its --job-log-dir and how a run that started well fails.

    job_dir.py     the directory checked before anything is written, its lock, config.json
    run_record.py  DIR/command.txt and DIR/train.log: how the job was made
    errors.py      RunError and its kinds: a run that failed mid-way (exit 1)

Below both the command line and the programs (and free of JAX): the command line reads a job
dir's saved config and names run errors; the programs lock, write and resume it.
"""
