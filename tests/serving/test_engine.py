"""Continuous batching (pax_eqx.serving.engine): greedy outputs equal `generate`'s, a seeded sample
does not depend on its batch, short requests overtake long ones, and traffic compiles exactly one
prefill and one generate program."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import assert_same_math

from pax_eqx.models import GreedyStrategy, LanguageModelConfig, SampleConfig, generate
from pax_eqx.serving.engine import Engine
from pax_eqx.serving.requests import QueueFull, Request, RequestError, Token
from pax_eqx.serving.row_sampling import RowSampling, choose_rows, filter_rows
from pax_eqx.serving.text_stream import TextStream


class Letters:
    """Token i is the letter chr(97 + i); 12 ('m') is EOS."""

    eos_id = 12

    def decode(self, ids):
        return "".join(chr(97 + i) for i in ids)


def tiny(repeat: bool = True):
    cfg = LanguageModelConfig(
        vocab_size=13, max_seq_len=32, num_layers=2, model_dims=16, hidden_dims=32, num_heads=4, repeat=repeat
    )
    return cfg.build(jax.random.key(0))


@pytest.fixture(scope="module")
def model():
    return tiny()


def run(engine: Engine) -> None:
    while engine.busy():
        engine.step()


def greedy(model, prompt, n):
    return greedy_all(model, [prompt], n)[0]


def greedy_all(model, prompts, n):
    """`generate`'s greedy continuations of `prompts` (a prompt continues alone as in a batch,
    tests/models/test_language_model.py), n tokens each: one compiled program."""
    cfg = SampleConfig(max_new_tokens=n, eos_id=-1, strategy=GreedyStrategy())
    return generate(model, prompts, cfg, jax.random.key(0))


@pytest.mark.parametrize("repeat", [True, False], ids=["scanned", "list"])
def test_greedy_equals_generate_and_traffic_compiles_two_programs(repeat):
    """Prompts longer than a chunk (prefilled in pieces), more requests than slots, mixed lengths:
    each output equals `generate`'s greedy continuation of that prompt, and the traces are
    exactly one prefill and one generate. Both cache layouts (a scanned stack's [layers, slots,
    ...], a list's per-layer [slots, ...]) take and put rows."""
    model = tiny(repeat)
    engine = Engine(model, Letters(), slots=3, chunk=4, eos_id=-5)
    prompts = [[1, 2, 3], [4, 5], list(range(11)), [7], [3] * 9, [2, 9, 4, 1, 0, 6]]
    lengths = [8, 3, 12, 1, 5, 10]
    done = [engine.submit(Request(tuple(p), max_tokens=n, temperature=0.0)) for p, n in zip(prompts, lengths)]
    run(engine)
    expected = greedy_all(model, prompts, max(lengths))
    for n, c, ref in zip(lengths, done, expected):
        f = c.result(timeout=1)
        assert f.reason == "length" and f.completion_tokens == n
        assert f.text == Letters().decode(ref[:n])
    assert engine.programs.trace_counts == {"prefill": 1, "generate": 1}


def test_a_seeded_sample_is_the_same_whatever_shares_the_batch(model):
    engine = Engine(model, Letters(), slots=4, chunk=4, eos_id=-5)
    request = Request((1, 2), max_tokens=10, temperature=1.0, top_k=5, top_p=0.9, seed=7)
    alone = engine.submit(request)
    run(engine)
    crowd = [engine.submit(Request((5, 6, 7), max_tokens=6, temperature=1.3, seed=i)) for i in range(2)]
    again = engine.submit(request)
    crowd.append(engine.submit(Request((9,) * 7, max_tokens=3, temperature=0.0)))
    run(engine)
    assert again.result().text == alone.result().text
    other = engine.submit(Request((1, 2), max_tokens=10, temperature=1.0, top_k=5, top_p=0.9, seed=8))
    run(engine)
    assert other.result().text != alone.result().text  # the seed matters (10 tokens of 5 choices)


def test_a_short_request_admitted_after_a_long_one_finishes_first(model):
    engine = Engine(model, Letters(), slots=2, chunk=4, eos_id=-5)
    long = engine.submit(Request(tuple(range(10)), max_tokens=20, temperature=0.0))
    engine.step()
    engine.step()
    short = engine.submit(Request((3,), max_tokens=2, temperature=0.0))
    order = []
    while engine.busy():
        engine.step()
        for name, c in (("long", long), ("short", short)):
            if c.finished is not None and name not in order:
                order.append(name)
    assert order == ["short", "long"]


def test_static_admission_waits_for_the_whole_batch(model):
    """The baseline the benchmark compares against: a slot frees, but nothing is admitted until
    every slot is free, so the short request waits for the long one."""
    engine = Engine(model, Letters(), slots=2, chunk=4, eos_id=-5, admit="static")
    long = engine.submit(Request(tuple(range(10)), max_tokens=20, temperature=0.0))
    first_short = engine.submit(Request((3,), max_tokens=2, temperature=0.0))
    late_short = engine.submit(Request((4,), max_tokens=2, temperature=0.0))
    steps = 0
    while late_short.finished is None:
        engine.step()
        steps += 1
    assert first_short.finished is not None and long.finished is not None  # the late one waited for both


def test_eos_stop_strings_and_max_tokens_end_a_request(model):
    ref = Letters().decode(greedy(model, [1, 2, 3], 12))
    engine = Engine(model, Letters(), slots=2, chunk=4, eos_id=ord(ref[3]) - 97)
    by_eos = engine.submit(Request((1, 2, 3), max_tokens=12, temperature=0.0))
    stop = ref[5:7]
    engine_stop = Engine(model, Letters(), slots=2, chunk=4, eos_id=-5)
    by_stop = engine_stop.submit(Request((1, 2, 3), max_tokens=12, temperature=0.0, stop=(stop, "zz")))
    run(engine)
    run(engine_stop)
    assert by_eos.result().reason == "stop" and by_eos.result().text == ref[: ref.index(ref[3])]
    f = by_stop.result()
    assert f.reason == "stop" and f.text == ref[: ref.index(stop)]
    streamed = ""
    while not by_stop.events.empty():
        e = by_stop.events.get()
        streamed += e.text if isinstance(e, Token) else ""
    assert streamed == f.text  # no piece of the stop string was ever sent


def test_cancel_and_timeout_free_the_slot(model):
    engine = Engine(model, Letters(), slots=1, chunk=4, eos_id=-5)
    gone = engine.submit(Request((1,), max_tokens=20, temperature=0.0))
    slow = engine.submit(Request((2,), max_tokens=20, temperature=0.0, timeout_s=1e-6))
    waiting = engine.submit(Request((3,), max_tokens=2, temperature=0.0))
    engine.step()
    gone.cancel()
    run(engine)
    assert gone.result().reason == "cancelled"
    assert slow.result().reason == "timeout"
    assert waiting.result().reason == "length"
    assert engine.stats().busy == 0


def test_bad_requests_name_the_field_and_a_full_queue_says_when_to_retry(model):
    engine = Engine(model, Letters(), slots=1, chunk=4, max_waiting=1, eos_id=-5)
    for request, field in [
        (Request(()), "prompt"),
        (Request((13,)), "prompt"),
        (Request((1,), max_tokens=0), "max_tokens"),
        (Request((1,) * 20, max_tokens=13), "max_tokens"),
        (Request((1,), temperature=-1.0), "temperature"),
        (Request((1,), top_p=0.0), "top_p"),
        (Request((1,), top_k=-2), "top_k"),
        (Request((1,), seed=-1), "seed"),
    ]:
        with pytest.raises(RequestError) as e:
            engine.submit(request)
        assert e.value.field == field
    engine.submit(Request((1,)))  # the free slot's
    engine.submit(Request((1,)))  # the queue's one place
    with pytest.raises(QueueFull) as e:
        engine.submit(Request((1,)))
    assert e.value.retry_after_s >= 1


def test_per_row_filters_match_their_formula():
    """filter_rows: row 0 keeps its top 2 logits, row 1 its nucleus of mass 0.7, row 2 everything."""
    logits = np.log(np.array([[0.1, 0.4, 0.2, 0.3], [0.1, 0.4, 0.2, 0.3], [0.1, 0.4, 0.2, 0.3]], np.float32))
    logits = jnp.asarray(logits)
    out = np.asarray(filter_rows(logits, jnp.array([2, 0, 0]), jnp.array([1.0, 0.7, 1.0], jnp.float32)))
    kept = out > np.finfo(np.float32).min
    assert kept.tolist() == [[False, True, False, True], [False, True, False, True], [True] * 4]
    greedy = RowSampling.zeros(3)
    assert np.asarray(choose_rows(logits, greedy)).tolist() == [1, 1, 1]


def test_streamed_text_holds_back_what_may_become_a_stop_string():
    stream = TextStream(Letters(), stop=("cd",))
    assert stream.push(0) == ("a", False)
    assert stream.push(2) == ("", False)  # "c" may begin "cd"
    assert stream.push(1) == ("cb", False)
    assert stream.push(2) == ("", False)
    assert stream.push(3) == ("", True)  # "...cd": the stop is never sent
    assert stream.sent == "acb"


def test_a_prompt_read_in_chunks_keeps_its_start_while_other_slots_generate(model):
    """While a long prompt is prefilled a chunk per step, `generate` runs for the other slots and
    this slot takes part in it inactive: its write must land where its next chunk writes anyway,
    never on the prompt's first tokens. Checked on the cache itself (a tiny model's greedy
    tokens barely move when one key is wrong): the prompt's keys equal those of the prompt read
    with no other request in the engine."""
    prompt = [5, 9, 2, 7, 7, 3, 8, 1, 4, 6, 2]  # three chunks; its first token is not the filler 0
    engine = Engine(model, Letters(), slots=2, chunk=4, eos_id=-5)
    busy = engine.submit(Request((1,), max_tokens=12, temperature=0.0))
    engine.step()  # `busy` is generating from here on, in slot 0
    long = engine.submit(Request(tuple(prompt), max_tokens=6, temperature=0.0))
    run(engine)
    alone = Engine(model, Letters(), slots=2, chunk=4, eos_id=-5)
    alone.submit(Request(tuple(prompt), max_tokens=6, temperature=0.0))
    run(alone)
    assert busy.result().completion_tokens == 12
    keys = lambda e, slot: np.asarray(e.state.cache.k[:, slot, : len(prompt)])  # [layers, time, heads, dim]
    assert_same_math(keys(engine, 1), keys(alone, 0))
    assert long.result().text == Letters().decode(greedy(model, prompt, 6))
