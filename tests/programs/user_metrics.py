"""A user's eval metric, named on the command line by its dotted path
(`--data.eval.metrics user_metrics.same_first_character`): SeqIO's fn(targets, predictions)."""


def same_first_character(targets: list[str], predictions: list[str]) -> float:
    """The share of outputs whose first character is the target's (a bare float: reported under
    the function's name)."""
    same = [t[:1] == p[:1] for t, p in zip(targets, predictions, strict=True)]
    return sum(same) / max(len(same), 1)
