"""The text towers batched end to end: one tokenizer call and one forward pass for a batch of sentences of varied
lengths gives each sentence's vector as embedding it alone does (the shipped model's MiniLM + GPO text tower), and the
forward a GPU runs (masked layers, GPO weights from a table by length) asks the host nothing: no ``nonzero``, no
``unique``, no value read back while the batch is queued; a one-way GRU likewise, without packing."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from training.data.vocab import pad_batch
from training.inference import pretrained
from training.inference.embedding import embed_texts
from training.models.checkpoint import load_model
from training.models.pooling import GPO

SENTENCES = ["a dog", "two children play in the snow near a red house on a hill",
             "A man in a blue shirt, riding a bike down a steep muddy trail… fast!", "cat",
             "a black and white dog is jumping over a wooden fence in the park while three people watch it",
             "", "surfer", "a group of people standing around a table with food and drinks at an outdoor party"]

# aten ops that make a CUDA host wait for the device (data-dependent shapes or a value read back)
SYNCING = ("nonzero", "unique", "_local_scalar_dense", "masked_select", "_unique2", "unique_consecutive", "item")


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def shipped():
    return load_model(pretrained.model_path()).eval()


@pytest.fixture
def masked(shipped):
    """The shipped model's MiniLM layers run as on a GPU (every position, padding masked), put back after."""
    bert = shipped.text_encoder.bert
    bert.packed = False
    yield shipped
    bert.packed = None


def _one_at_a_time(model) -> torch.Tensor:
    return torch.cat([embed_texts(model, [s]) for s in SENTENCES])


def test_the_shipped_text_tower_batched_equals_one_sentence_at_a_time(shipped):
    assert shipped.text_encoder.pool.kind == "gpo"
    alone = _one_at_a_time(shipped)
    ids = shipped.encode_text_ids(SENTENCES)
    assert len({len(i) for i in ids}) >= 6                                  # lengths 2 … 20+ in one batch
    assert torch.allclose(embed_texts(shipped, SENTENCES), alone, atol=1e-5)
    shipped.text_encoder.bert.packed = False
    try:
        assert torch.allclose(embed_texts(shipped, SENTENCES), alone, atol=1e-5)
    finally:
        shipped.text_encoder.bert.packed = None


def test_one_tokenizer_call_gives_each_sentences_word_pieces(shipped, monkeypatch):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")     # no thread pool started in the test process
    enc = shipped.text_encoder
    long = " ".join(["word"] * 400)
    texts = [*SENTENCES, long]
    batched = enc.encode_texts(texts, parallel=True)
    assert batched == [enc.encode_text(t) for t in texts] == enc.encode_texts(texts, parallel=False)
    assert len(batched[-1]) == enc.max_tokens and batched[-1][-1] == batched[0][-1]          # cut, [SEP] kept


def test_the_masked_forward_asks_the_host_nothing(masked):
    ids, lengths = pad_batch(masked.encode_text_ids(SENTENCES))
    with torch.no_grad():
        masked.project_texts(ids, lengths)            # the GPO table built once, outside the recording
        ops = _Ops()
        with ops:
            masked.project_texts(ids, lengths)
    assert {"sort", "embedding", "index"} <= ops.names                 # the recording sees the forward's ops
    assert not {op for op in ops.names if op.strip("_") in SYNCING or op in SYNCING}
    masked.text_encoder.bert.packed = True
    with torch.no_grad(), _Ops() as packed:
        masked.project_texts(ids, lengths)
    assert "nonzero" in packed.names                  # the CPU's packed layers: the recording sees a sync


def test_gpo_table_equals_the_generator_and_follows_the_weights():
    torch.manual_seed(0)
    gpo = GPO().eval()
    lengths = torch.tensor([1, 5, 2, 5, 33, 7])
    with torch.no_grad():
        table = gpo.weights(lengths, 40)
    generated = gpo._generate(lengths, 40)                          # eq. 4 per length, as training computes it
    assert torch.allclose(table, generated, atol=1e-6)
    assert torch.allclose(table.sum(1), torch.ones(len(lengths))) and (table[0, 1:] == 0).all()
    with torch.no_grad():
        gpo.score.weight.mul_(-1)                                    # new weights: the table is computed again
        again = gpo.weights(lengths, 80)
    assert torch.allclose(again[:, :40], gpo._generate(lengths, 40), atol=1e-6) and not torch.allclose(
        again[:, :40], table, atol=1e-3)
    gpo.train()
    assert torch.allclose(gpo.weights(lengths, 40), gpo._generate(lengths, 40))   # training: the generator itself


@pytest.mark.parametrize("pooling", ["last", "mean", "max"])
def test_a_one_way_gru_gives_the_packed_vectors_without_packing(pooling):
    from training.models.text_encoders import GRUEncoder

    torch.manual_seed(0)
    enc = GRUEncoder(50, word_dim=8, hidden=12, layers=2, pooling=pooling).eval()
    ids, lengths = pad_batch([[5, 6, 7, 8, 9], [4], [10, 11, 3], [], [12, 13]])
    with torch.no_grad():
        with _Ops() as packing:
            packed = enc(ids, lengths)                  # a CPU: packed, which reads the lengths on the host
        assert {"_pack_padded_sequence", "_local_scalar_dense"} <= packing.names
        enc.packed = False
        with _Ops() as ops:
            padded = enc(ids, lengths)
    assert torch.allclose(packed, padded, atol=1e-6)
    assert not {op for op in ops.names if op.strip("_") in SYNCING or op in SYNCING}
