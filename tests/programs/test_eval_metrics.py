"""Host-side eval metrics named by the input (data.eval.metrics) against direct formulas."""

import numpy as np
import pytest

from pax_eqx.config import ConfigError
from pax_eqx.data import InputConfig
from pax_eqx.metric_fns import EvalContext
from pax_eqx.programs.evaluate import eval_metrics


def _batches():
    # Two batches; the second ends with a padded row (weight 0) that must not count.
    return [
        {"predicted": np.array([0, 1, 2]), "label": np.array([0, 1, 1]), "weight": np.array([1.0, 1.0, 1.0])},
        {"predicted": np.array([2, 0, 1]), "label": np.array([2, 2, 0]), "weight": np.array([1.0, 1.0, 0.0])},
    ]


def test_confusion_and_balanced_accuracy_over_the_real_rows(tmp_path):
    rows = eval_metrics.real_rows(_batches())
    assert rows["label"].tolist() == [0, 1, 1, 2, 2]
    counts = eval_metrics.confusion(rows, 3)
    expected = np.zeros((3, 3), int)
    for label, predicted in zip([0, 1, 1, 2, 2], [0, 1, 2, 2, 0]):
        expected[label, predicted] += 1
    np.testing.assert_array_equal(counts, expected)
    context = EvalContext(tokenizer=None, job_dir=tmp_path, step=7)
    scores = eval_metrics.score(("confusion_matrix", "balanced_accuracy"), rows, {}, context)
    assert scores == {"balanced_accuracy": pytest.approx((1 / 1 + 1 / 2 + 1 / 2) / 3)}
    assert (tmp_path / "plots" / "confusion.png").exists()


def test_a_model_without_per_example_outputs_is_named():
    with pytest.raises(ConfigError, match="per_example_outputs"):
        eval_metrics.real_rows([{}])


def test_metrics_on_the_train_split_are_refused():
    with pytest.raises(ConfigError, match="data.train.metrics"):
        InputConfig(metrics=("confusion_matrix",)).validate("train")
