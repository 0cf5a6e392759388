import os

# Tests never download: every model is built here or embedded.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import model_threads  # noqa: E402

# Tiny models run fastest on one thread, and two threads spin-wait badly when the machine is
# busy (100x slower seen here); the default-model tests ask for more threads themselves.
torch.set_num_threads(1)


@pytest.fixture
def real_model_threads():
    """Sets model_threads() for one test and restores the suite's one thread afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(model_threads())
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_llama():
    from helpers import tiny_model

    return tiny_model("llama")


@pytest.fixture(scope="module")
def tiny_loaded():
    """A tiny random 8-layer Llama as a LoadedModel with a character tokenizer (what the app,
    bench, sweep and hosting tests serve). One per test module: tests may change its state."""
    from helpers import EOS, char_tokenizer, tiny_model

    from hispec.model.early_exit import EarlyExitModel
    from hispec.model.loading import LoadedModel

    model = tiny_model("llama", layers=8)
    model.generation_config.eos_token_id = EOS
    return LoadedModel("tiny", model, char_tokenizer(), EarlyExitModel(model), "cpu", "float32", 0.0, "t")
