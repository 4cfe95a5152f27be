"""The command-line surface: what a person types and reads, apart from the programs it starts.

    cli          parse `--exp NAME --job-log-dir DIR --section.field VALUE`, the help, the flags
                 set in Python only, eval/decode's experiment read from DIR/config.json
    registry     named experiments, Pax's class names, dotted paths, config.json files
    entry        `python -m pax_eqx.<program>` plumbing: one `error:` line and its exit status
    host_memory  the process's allocator settings every program starts with

It imports the experiment config, never `pax_eqx.programs` (the compiled steps and the host
loops): the entry points join the two rooms.
"""
