"""W&B run logs of every kind for the readers' tests (tests/suggest/test_wandb_compiled.py and
test_wandb_vectorized.py): hypothesis strategies of value texts, records and Trainer logs, and the log
read by each reader (the compiled, the NumPy and the Python one), which must agree."""

from __future__ import annotations

from hypothesis import strategies as st

from gradtool.errors import InputError, UsageError
from gradtool.io import wandb_log
from tests.wandb_encoder import pb_bytes, pb_int, write_log

number_texts = st.one_of(
    st.floats().map(lambda f: repr(f).encode()),
    st.tuples(st.floats(allow_nan=False, allow_infinity=False),
              st.sampled_from(["e", ".15g", ".3f", ".17g", ".6E"])).map(lambda t: format(*t).encode()),
    st.integers(-10**20, 10**20).map(lambda i: str(i).encode()),
    st.from_regex(rb"\A-?[0-9]{1,25}(\.[0-9]{0,25})?([eE][+-]?[0-9]{1,4})?\Z"),
    st.tuples(st.integers(1, 10**19 - 1), st.integers(-150, 90)).map(lambda t: f"{t[0]}e{t[1]}".encode()),
    st.binary(max_size=12),
    st.text("0123456789.eE+-_ NaInfity", max_size=12).map(str.encode),
)


KEYS = [b"train/grad_norm", b"grad_norm", b"train/global_step", b"train/loss", b"train/learning_rate",
        b"eval/loss", b"_step", b"grad_2.0_norm/w", b"grad_inf_norm/w", b"img", b"\xff", b"\xfe", b"k" * 120,
        b"_runtime"]
VALUES = st.one_of(number_texts, st.sampled_from([b'{"_type": "image-file"}', b'"text"', b"", b"-",
                                                   b"99999999999999999999", b"true"]))


@st.composite
def records(draw):
    """One record: a history row (items in wandb's layout or others, a step field or none), or another
    kind of record."""
    kind = draw(st.sampled_from(["row"] * 6 + ["other", "odd_item", "odd_record", "odd_field"]))
    if kind == "other":
        return pb_int(1, 1) + pb_bytes(4, pb_bytes(3, b"x" * draw(st.integers(0, 40000))))
    items = []
    for _ in range(draw(st.integers(0, 6))):
        key, value = draw(st.sampled_from(KEYS)), draw(VALUES)
        if kind == "odd_item" and draw(st.booleans()):  # a nested key, or fields in another order
            items.append(pb_bytes(1, pb_bytes(16, value) + pb_bytes(1, key)) if draw(st.booleans())
                         else pb_bytes(1, pb_bytes(2, b"grads") + pb_bytes(2, key) + pb_bytes(16, value)))
        else:
            items.append(pb_bytes(1, pb_bytes(1, key) + pb_bytes(16, value)))
    if kind == "odd_field":  # fields besides items and the step: wandb's _info (200), an unknown varint,
        # fixed-width and varint fields 1 and 2 (Python takes the fixed-width ones as bytes)
        extra = st.sampled_from([pb_bytes(200, pb_bytes(1, b"stream")), pb_int(3, 7), pb_int(1, 5),
                                 pb_int(2, 9), b"\x09" + bytes(8), b"\x15" + bytes(4), b"\x1d" + bytes(4),
                                 pb_bytes(1, b""), b"\x80\x01\x00"])
        for _ in range(draw(st.integers(1, 2))):
            items.insert(draw(st.integers(0, len(items))), draw(extra))
    body = b"".join(items)
    if draw(st.booleans()):
        body += pb_bytes(2, pb_int(1, draw(st.one_of(st.integers(0, 10**6), st.integers(0, 2**63)))))
    record = pb_int(1, draw(st.integers(0, 10**6))) + pb_bytes(2, body)
    if kind == "odd_record":  # a fixed-width field before the history, or the history as fixed64
        record = draw(st.sampled_from([b"\x11" + bytes(8) + record, b"\x11" + bytes(8), b"\x15" + bytes(4)]))
    return record


def _history_steps(draw, n):
    """Rows of norm, step and loss in the ways logs hold them: steps in order, going back (resumed, or a
    second training), missing, or floats."""
    return draw(st.lists(st.one_of(st.integers(0, 60), st.none(), st.floats(-5, 70)), min_size=n, max_size=n))


@st.composite
def trainer_logs(draw):
    """Records as the Trainer's W&B callback writes them (train/* rows, eval rows between) with other
    records and steps in every order."""
    out = []
    n = draw(st.integers(1, 40))
    for step in _history_steps(draw, n):
        items = {}
        if draw(st.integers(0, 9)):
            items[b"train/grad_norm"] = draw(number_texts)
        if draw(st.integers(0, 3)):
            items[b"train/loss"] = draw(number_texts)
        if draw(st.booleans()):
            items[b"train/learning_rate"] = b"4.9e-05"
        if draw(st.booleans()):
            other = draw(st.sampled_from([b"grad_2.0_norm/w", b"grad_inf_norm/w", b"eval/loss"]))
            items[other] = draw(number_texts)
        if step is not None:
            items[b"train/global_step"] = (str(step) if isinstance(step, int) else repr(step)).encode()
        body = b"".join(pb_bytes(1, pb_bytes(1, k) + pb_bytes(16, v)) for k, v in items.items())
        out.append(pb_int(1, len(out)) + pb_bytes(2, body + pb_bytes(2, pb_int(1, len(out)))))
        if not draw(st.integers(0, 5)):
            out.append(draw(records()))
    return out


class SmallKeyTable:
    """The compiled reader with a key table of ``max_keys`` keys (not 65,536): records that find it full
    read again from an empty one, records of more keys left to Python."""

    def __init__(self, reader, max_keys):
        self._reader, self._max_keys = reader, max_keys

    def __getattr__(self, name):
        return getattr(self._reader, name)

    def key_table(self):
        return self._reader.key_table(self._max_keys)


def read_with(path, key, how):
    """The history of the log read by the compiled reader ("compiled"; "compiled-small": with a key table
    of 4 keys), the NumPy reader ("numpy"; "numpy-bytes": every record's items looked for by their bytes
    first) or the Python reader alone ("python")."""
    from gradtool.io import wandb_vectorized

    compiled, vectorized, long = wandb_log._compiled_reader, wandb_log._vectorized, wandb_vectorized.LONG_HISTORY
    if how == "numpy-bytes":  # every record's items looked for by their bytes first (chained_items)
        wandb_vectorized.LONG_HISTORY = 0
        how = "numpy"
    if how == "compiled-small":
        wandb_log._compiled_reader = lambda: SmallKeyTable(compiled(), 4)
    elif how != "compiled":
        wandb_log._compiled_reader = lambda: None
    wandb_log._vectorized = lambda: how == "numpy"
    try:
        h = wandb_log.read_wandb_log(str(path), key)
    except (InputError, UsageError) as exc:
        return type(exc), str(exc)
    finally:
        wandb_log._compiled_reader, wandb_log._vectorized = compiled, vectorized
        wandb_vectorized.LONG_HISTORY = long
    return (h.steps, [repr(v) for v in h.norms], [repr(v) for v in h.loss], [repr(v) for v in h.lr],
            h.key, h.notes, h.other_keys, repr(h.tensor_norms), repr(h.tensor_max_abs))  # (NaN: by repr)


def read_every_way(tmp_path_factory, recs, key=None, damage=None):
    """The log of records ``recs`` (a byte of it changed: ``damage``) read by each reader: the same."""
    p = write_log(tmp_path_factory.mktemp("w") / "run-x.wandb", recs)
    if damage is not None:
        data = bytearray(p.read_bytes())
        at, byte = damage
        data[at % len(data)] ^= byte
        p.write_bytes(bytes(data))
    slow = read_with(p, key, "python")
    assert read_with(p, key, "numpy") == slow
    assert read_with(p, key, "numpy-bytes") == slow
    if wandb_log._compiled_reader() is not None:
        assert read_with(p, key, "compiled") == slow
        assert read_with(p, key, "compiled-small") == slow
    return slow


def history_record(i, items, step=None):
    body = b"".join(pb_bytes(1, pb_bytes(1, k) + pb_bytes(16, v)) for k, v in items)
    return pb_int(1, i) + pb_bytes(2, body + (b"" if step is None else pb_bytes(2, pb_int(1, step))))
