# fmt: off
"""Greedy continuation with `python -m pax_eqx.export`'s files, with only jax and numpy: `python run_exported.py OUT
1 2 3 --max-tokens 8` prints the new token ids. The server's steps for one request (slot 0): prefill, then generate."""
import argparse, json, pathlib, jax, numpy as np  # noqa: E401, I001
parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("out", type=pathlib.Path, help="the directory python -m pax_eqx.export wrote")
parser.add_argument("prompt", type=int, nargs="+", help="the prompt's token ids")
parser.add_argument("--max-tokens", type=int, default=16)
args = parser.parse_args()
m = json.loads((args.out / "manifest.json").read_text())
if len(args.prompt) + args.max_tokens > m["max_seq_len"]:
    parser.error(f"the prompt's ids + --max-tokens exceed the model's max_seq_len, {m['max_seq_len']}")
run = {p: jax.jit(jax.export.deserialize((args.out / m[p]["file"]).read_bytes()).call) for p in ("prefill", "generate")}
npz = {f: np.load(args.out / f"{f}.npz") for f in ("weights", "state")}  # bfloat16 & co. stored as their bits
weights, state = ([jax.device_put(npz[f][e["name"]].view(e["dtype"]), jax.devices()[0]) for e in m[f]] for f in npz)
defaults = {"slot": 0, "temperature": 0, "top_k": 0, "top_p": 1, "seed": 0, "count": 0}  # slot 0, greedy
def call(program, state, **inputs):  # the per-call inputs by name, in the manifest's order, dtypes and shapes
    values = [np.broadcast_to(np.asarray({**defaults, **inputs}[e["name"]], e["dtype"]), e["shape"])
              for e in m[program]["inputs"] if e["source"] == "call"]
    *state, result = run[program](*weights, *state, *values)
    return state, int(np.asarray(result).flat[0])  # prefill's token, or generate's token for slot 0
ids, chunk, slots, new = args.prompt, m["chunk"], m["slots"], []
for start in range(0, len(ids), chunk):  # a chunk per call, zero-padded, as the Engine prefills
    piece = ids[start : start + chunk]
    state, token = call("prefill", state, chunk=piece + [0] * (chunk - len(piece)), n_valid=len(piece), start=start)
while token != m["eos_id"] and len(new) < args.max_tokens:  # a token per generate step; slots 1.. free
    new.append(token)
    if len(new) < args.max_tokens:
        state, token = call("generate", state, tokens=[token] + [0] * (slots - 1), active=np.arange(slots) == 0)
print(*new)
