"""Users' eval metrics (`--data.eval.metrics checks_metrics.NAME`), good and broken, for
test_checks_before_compile.py: SeqIO's fn(targets, predictions) -> {name: float} or a float."""


def raises(targets, predictions):
    raise ValueError("a bug in my metric")


def returns_text(targets, predictions):
    return "0.5"


def returns_none(targets, predictions):
    return None


def text_inside(targets, predictions):
    return {"score": "high"}


def no_args():
    return 1.0


def first_letter(targets, predictions):
    """The share of outputs whose first letter is the target's: an IndexError on an empty output,
    which one made-up pair does not show (the eval's outputs do)."""
    same = [t[0] == p[0] for t, p in zip(targets, predictions, strict=True)]
    return {"first_letter": sum(same) / len(same)}
