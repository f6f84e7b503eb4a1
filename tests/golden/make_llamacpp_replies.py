"""Builds tests/golden/llamacpp_replies.json (python tests/golden/make_llamacpp_replies.py tests/golden/llamacpp_replies.json): DnA pair-score replies shaped as llama.cpp's server
sends them under a JSON schema with logprobs (alternatives from before the schema applied)."""
import json, math, random, sys

rng = random.Random(41)
NON = ["type", "response", "id", "A", "JSON", "\n", " ", "{\"", "```", "Response"]


def pos(token, alts):
    """alts: {token: prob} (pre-constraint); the generated token's logprob is its own there."""
    lp = {t: math.log(p) for t, p in alts.items()}
    if token not in lp:
        lp[token] = math.log(rng.uniform(0.001, 0.01))
    top = sorted(lp.items(), key=lambda kv: -kv[1])[:10]
    return {"id": 0, "token": token, "bytes": list(token.encode()), "logprob": round(lp[token], 4),
            "top_logprobs": [{"id": 0, "token": t, "bytes": list(t.encode()), "logprob": round(v, 4)} for t, v in top]}


def filler(token, decoy=None):
    """A structural token; pre-constraint the model liked other tokens better, a digit among them
    (``decoy``), as after 'score_' where it would have written 'score1'."""
    alts = {token: rng.uniform(0.1, 0.3)}
    for t in rng.sample(NON, 3):
        alts.setdefault(t, rng.uniform(0.05, 0.25))
    if decoy is not None:
        alts[decoy[0]] = 0.45  # the likeliest before the schema: a digit where none may go
        for d, p in decoy[1].items():
            alts[d] = p
    return pos(token, alts)


def score(value, spread=0.12, rival=None):
    """The score's token: pre-constraint, prose tokens rank above it; digits near it share the rest."""
    alts = {"\"": 0.2, " ": 0.1}
    alts[str(value)] = 0.45
    for d in (value - 1, value + 1):
        if 1 <= d <= 10:
            alts[str(d)] = spread * 0.25
    if rival is not None:  # a digit likelier than the generated one: not the distribution it came from
        alts[str(rival)] = 0.6
    return pos(str(value), alts)


def reply(a, b, *, fence=False, decoy=None, rival=None, cut=False, ten_split=False):
    toks = []
    if fence:  # counted in logprobs, stripped from the text
        toks += [filler("```"), filler("json"), filler("\n")]
    toks += [filler("{"), filler("\n "), filler(" \""), filler("score"),
             filler("_", decoy and ("1", {"2": 0.05, "9": 0.3, "8": 0.2})), filler("a"), filler("\":"), filler(" ")]
    def num(v, r):
        if v == 10 and ten_split:
            return [score(1), filler("0")]
        return [score(v, rival=r)]
    toks += num(a, None) + [filler(",\n "), filler(" \""), filler("score"), filler("_"), filler("b"), filler("\":"),
                            filler(" ")] + num(b, rival)
    if not cut:
        toks += [filler("\n"), filler("}")]
    if fence:
        toks += [filler("\n"), filler("```")]
    text = "".join(t["token"] for t in toks)
    if fence:
        text = text[len("```json\n"):-len("\n```")]
    return {"choices": [{"index": 0, "finish_reason": "length" if cut else "stop",
                         "message": {"role": "assistant", "content": text},
                         "logprobs": {"content": toks}}],
            "model": "SmolLM2-135M-Instruct.Q4_1.gguf", "usage": {"prompt_tokens": 540, "completion_tokens": len(toks)}}


replies = []
plan = [(7, 7, {}), (1, 1, {}), (7, 7, {"decoy": True}), (1, 1, {"decoy": True}), (1, 1, {"fence": True}),
        (7, 4, {"fence": True}), (1, 1, {"rival": 5}), (2, 1, {"rival": 9}), (10, 10, {"cut": True, "ten_split": True}),
        (10, 9, {}), (8, 6, {}), (3, 9, {"decoy": True, "fence": True}), (7, 7, {"cut": True}), (5, 6, {}),
        (1, 1, {"decoy": True, "rival": 4}), (9, 9, {}), (4, 4, {"fence": True}), (6, 2, {}),
        (1, 7, {"decoy": True}), (7, 1, {"rival": 6}), (2, 2, {}), (10, 1, {"ten_split": True}), (5, 5, {"decoy": True}),
        (3, 3, {})]
for a, b, kw in plan:
    kw = {**kw, "decoy": (True if kw.get("decoy") else None)}
    replies.append(reply(a, b, **kw))
json.dump({"about": "DnA pair-score replies in the shape of llama.cpp's server (logprobs from before the "
           "JSON schema applied; a ```json fence counted there but stripped from the text; a digit likelier "
           "than the generated one; 10 split in two tokens; replies cut at the token budget). Built, seeded, by "
           "tests/golden/make_llamacpp_replies.py.",
           "dna_score": replies}, open(sys.argv[1], "w"), indent=None, separators=(",", ":"))
