"""/generate's stream while it runs: after the waiting room's words, every update carries the tokens committed
so far and their text (a client can show the answer as it grows), each a prefix of the final answer."""

from helpers import EOS, char_tokenizer, tiny_model

from hispec.engine.config import preset
from hispec.engine.decoding import decode
from hispec.engine.events import DoneEvent
from hispec.model.early_exit import EarlyExitModel
from hispec.serving.answer import api_answer
from hispec.serving.updates import Ended, Output, Waiting
from hispec.text import Detokenizer


def test_every_update_while_it_runs_holds_a_prefix_of_the_answer():
    model = tiny_model("llama", layers=8, seed=1)
    model.generation_config.eos_token_id = EOS
    ids = [5, 17, 33, 5, 17, 33]
    events = list(decode(EarlyExitModel(model), ids, preset("hispec", max_new_tokens=30),
                         detok=Detokenizer(char_tokenizer())))
    assert isinstance(events[-1], DoneEvent)
    updates = [Waiting.behind(1), Output(({"prompt_ids": ids},)), *(Output((ev,)) for ev in events),
               Ended("done", "")]
    out = list(api_answer(updates, lambda run: ""))
    answer, progress = out[-1], out[1:-1]
    assert out[0] == {"status": Waiting.behind(1).text}  # before it runs: the waiting room's words only
    final = answer["token_ids"]
    assert len(final) == 30 and "status" not in answer
    counts = [len(p["token_ids"]) for p in progress]
    assert counts == sorted(counts) and counts[-1] == 30 and len(set(counts)) > 10, counts  # it grew as it ran
    pieces = {ev.index: ev.text for ev in events if getattr(ev, "state", None) is not None}
    for p in progress:
        n = len(p["token_ids"])
        assert p["token_ids"] == final[:n] and p["status"] == f"generating: {n} tokens"
        assert p["text"] == "".join(pieces[i] for i in range(n))
    assert progress[-1]["text"] == answer["text"]
