"""A test helper: a dump summarised with its small compressed tensors inflated whole, many to a call (the
reader's ``inflate_members``, ``summarize.inflated_small_stats``), and again with each one streamed."""

from gradtool import open_dump
from gradtool import summarize as summarize_mod
from gradtool.summarize import summarize_dump


def whole_and_streamed(path, monkeypatch, reader_class):
    """(summary with small members inflated whole, summary with each streamed, the names of the tensors
    ``reader_class.inflate_members`` was asked for)."""
    got = []
    real = reader_class.inflate_members

    def spy(self, infos, *rest):
        got.extend(i.name for i in infos)
        return real(self, infos, *rest)

    with monkeypatch.context() as m:
        m.setattr(reader_class, "inflate_members", spy)
        with open_dump(path) as reader:
            whole = summarize_dump(reader)
        m.setattr(summarize_mod, "_small_members", lambda *a: set())
        with open_dump(path) as reader:
            streamed = summarize_dump(reader)
    return whole, streamed, got
