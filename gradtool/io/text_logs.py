"""Console logs as gradient-norm histories: text lines (Megatron-LM's ``iteration 100/ 1000 | ... | grad
norm: 1.234 |``, torchtitan, OLMo, Composer, MMEngine, fairseq, nanoGPT-derived loops, llm.c), read with
patterns on lowercased lines, never evaluated (lines that end in a dict of metrics, the Hugging Face
Trainer's console: :mod:`~gradtool.io.dict_lines`). :func:`~gradtool.io.logs.read_norm_log` tells these from
the structured logs (:mod:`~gradtool.io.logs`) and hands them here.
"""

from __future__ import annotations

import bisect
import json
import re
from functools import partial
from itertools import islice
from typing import Any

from ..errors import InputError, UsageError
from .logs import NormHistory, _clip_words, _find_norm_key, _noted, _read_text, from_records

# 1,234 at the end of a value, matched possessively: the first form has one way to match where it does
# (fewer digits leave a digit where a "," is wanted, fewer groups a "," where a space is), so giving up its
# backtracking changes no match and spares the steps back of every number without commas (a torchtitan
# line by its template 1.8 -> 1.6 us)
_UNSIGNED = r"(?:\d{1,3}+(?:,\d{3})++(?=\s|$)|\d+\.?\d*(?:[eE][-+]?\d+)?)"
_NUMBER = rf"[-+]?{_UNSIGNED}"
_IS = r"[\"']?\s*[:=]?\s*(?:tensor\()?"  # between a name and its value: grad norm: 1.2, grad_norm=1.2,
# "grad_norm": 1.2, and a PyTorch tensor printed with print(), str() or %s: tensor(1.2345, device='cuda:0')
# The text patterns are matched on lowercased lines: re.IGNORECASE made them 3x slower.
_NORM_NAME = r"(?:grad[ _-]?norm|gnorm|total_norm|l2_norm/grad/global)"  # the last: Composer's
_TEXT_NORM = re.compile(rf"{_NORM_NAME}{_IS}({_NUMBER}|nan|inf(?:inity)?)")
# Every name of _NORM_NAME holds "norm" at most this many characters after it starts ("total_norm"), so no
# match of _TEXT_NORM (no "^", no look-behind) starts earlier before the first "norm" of a line: searched
# from there, the same match without the pattern tried at every character before (Python's re scans an
# alternation of names character by character): 1.4 -> 0.4 us on a Megatron line
_NORM_WORD_AT = 6
_TEXT_NORM_NAMED = re.compile(  # the same with up to two words before and after the name: see _text_norm
    rf"((?:[a-z]+[ _-]){{0,2}}){_NORM_NAME}((?:[ _-][a-z]+){{0,2}})"
    rf"{_IS}({_NUMBER}|nan|inf(?:inity)?)")
_TEXT_STEP = re.compile(rf"(?:iteration|iter|step|global_step|num_updates){_IS}(\d+)")
# MMEngine's (OpenMMLab's): Epoch(train)  [2][ 50/270] (the 50th of epoch 2), Iter(train) [ 50/1000]
_MMENGINE_STEP = re.compile(
    r"epoch\(train\)\s*\[(\d+)\]\[\s*(\d+)/(\d+)\]|iter\(train\)\s*\[\s*(\d+)/\d+\]")
_LLMC_STEP = re.compile(r"s:(\d+)")  # llm.c's main.log: "s:100 trl:3.2 lr:0.0006 norm:0.45"
_LLMC_LINE = re.compile("\ns:")  # a line of llm.c's main.log: found 2x faster than by `"\ns:" in text`
_LLMC_LOSS = re.compile(rf"\strl:({_NUMBER}|nan|inf)")  # its train loss; a "trl" among _TEXT_LOSS's names: 2x
# "norm" alone, after a separator or a value: nanoGPT-derived loops' "| norm: 1.23 |", llm.c's "| norm 1.2
# (+0.1z)|" and its main.log's "lr:0.0006 norm:0.45"; not "param norm", "layer_norm" (read only from a log
# without a gradient norm of _TEXT_NORM's names)
_BARE_NORM = re.compile(rf"(?:^|[|,;\t]|(?<=[\d)%\]]) )\s*norm{_IS}({_NUMBER}|nan|inf(?:inity)?)")
_BATCH_HEADER = re.compile(r"(?:^|\s)\[batch=(\d+)(?:/\d+)?\]:?\s*$")  # Composer's console, in batches
_TEXT_LOSS = re.compile(rf"(?:lm loss|loss/train/total|loss){_IS}({_NUMBER}|nan|inf)")  # Composer's 2nd
_TEXT_LR = re.compile(rf"(?:learning rate|lr-[a-z]+/group0|lr)(?:\s*\([^()]*\))?{_IS}({_NUMBER})")


def read_text_log(path: str, key: str | None = None, text: str | None = None) -> NormHistory:
    """Megatron-style lines: ``iteration 100/ 1000 | ... | lm loss: 2.3 | grad norm: 1.234 | ...``; also
    torchtitan's ``step: 10  loss: 8.1  grad_norm: 1.2`` (terminal colour codes are dropped first), and
    blocks of one metric per line under a step line, OLMo's console::

        [step=100/3000,epoch=0]
            train/CE loss=3.21
            optim/total grad norm=0.4212

    and Composer's (LLM Foundry's), whose step line is ``[batch=100/3000]:`` and norm line
    ``Train l2_norm/grad/global: 0.4212``. A log with none of the gradient-norm names is read for a norm
    named "norm" alone, as nanoGPT-derived loops (``step 10 | loss: 3.2 | lr 6e-4 | norm: 0.41 |``) and
    llm.c (``step 10/74 | loss 3.2 (+0.1z)| norm 0.41 (-0.2z)|``; its main.log ``s:10 trl:3.2 lr:0.0006
    norm:0.41``) print it; the history says so.

    A norm line without a step of its own takes the step line before it (once). Norm lines still without
    a step are left out when most have one (a warning that names the norm); when most have none, the
    steps are the lines' order. Either is said in the history's notes.

    The norm is found by its names: ``key`` (``--key``) may name one of them (``grad_norm``, ``grad
    norm``, ``norm``, ...); another is a usage error (it was ignored, and the norm read without a word)."""
    if key is not None and key.strip().lower() != "norm" and not re.search(_NORM_NAME, key.lower()):
        raise UsageError(f"{path}: no metric {key!r}: a text log's gradient norm is read by its name ('grad "
                         "norm', 'grad_norm', 'gnorm', 'total_norm', 'norm', ...); --key picks a metric of a "
                         "log of named values (JSON Lines, CSV, dict lines, a tracker's run)")
    text = _read_text(path) if text is None else text
    text = without_terminal_codes(text)
    llmc = text.startswith("s:") or _LLMC_LINE.search(text) is not None  # llm.c's main.log (s:100 ...)
    notes: list[str] = []
    if is_fairseq(text):
        lines, notes = _without_fairseq_epoch_ends(text, text.lower().splitlines())
        text = "\n".join(lines)  # (lowercased: lowering it again changes nothing)
    text = _newline_lines(text)
    (records, template), bare = _text_records(text, False, llmc), False
    if not records:  # nanoGPT-derived loops and llm.c name the gradient norm "norm"
        (records, template), bare = _text_records(text, True, llmc), True
    if not records:
        raise InputError(f"{path}: no 'grad norm: X' values found in this text log")
    hist = _noted(_text_history(records, path, template), notes)
    if bare:
        hist.key = "norm"
        hist.notes.append(f"{path}: no 'grad norm' in this log: the norm is read from 'norm' (the gradient "
                          "norm of nanoGPT-derived loops and llm.c)")
    return hist


# fairseq's logger "train": an epoch's summary (its interval lines' is "train_inner"); as text
# "... | train | epoch 001 | loss 9.1 | ... | gnorm 2.9 | ...", as JSON "... | train | {...}"
_FAIRSEQ_EPOCH_END = "| train | "
_FAIRSEQ_INNER = "| train_inner | "


def is_fairseq(text: Any) -> bool:
    """True for fairseq's console (``fairseq-train``'s log, simple or JSON format): its interval lines
    come from its logger "train_inner", ``"| train_inner | " in text`` (a str, or the UTF-8 bytes of one:
    a memory map). A log without an underscore (Megatron's console has none) is told by one search for it
    at ``memchr``'s speed; another by a search for "train_inner", each place it is checked for the rest of
    the phrase (the phrase's own search runs at half that speed on lines full of " | " and spaces: the
    Trainer's console with progress bars 0.17 -> 0.08 s), up to 64 places, then the phrase's search from
    there. Bytes are searched by the compiled reader's ``find`` (memmem) when it is there."""
    from .compiled import log_readers

    words, find = ("_", "train_inner", _FAIRSEQ_INNER), text.find
    if not isinstance(text, str):
        words = tuple(w.encode() for w in words)
        if (readers := log_readers()) is not None:  # memmem: 228 MB without the word 0.06-0.09 -> 0.015 s
            find = partial(readers.find, text)
    under, inner, phrase = words
    if find(under, 0) < 0:  # (0: a memory map's find starts from its file position)
        return False
    at = find(inner, 0)
    for _ in range(64):
        if at < 0:
            return False
        if at >= 2 and text[at - 2:at - 2 + len(phrase)] == phrase:
            return True
        at = find(inner, at + 1)
    return at >= 0 and find(phrase, max(at - 2, 0)) >= 0  # (every place before at checked)


def _without_fairseq_epoch_ends(text: str, lines: list[str]) -> tuple[list[str], list[str]]:
    """``lines`` of the log ``text`` without fairseq's end-of-epoch "train" lines (its epoch's means, no
    step's values), and what to say of the log (:func:`_fairseq_notes`); for another log, both as given
    and nothing to say."""
    if not is_fairseq(text):
        return lines, []
    kept = [line for line in lines if _FAIRSEQ_EPOCH_END not in line]
    return kept, _fairseq_notes(len(lines) - len(kept))


def _fairseq_notes(epoch_ends: int) -> list[str]:
    """What to say of a fairseq log (``fairseq-train``'s console, simple or JSON format): its ``gnorm``
    is a mean over each ``--log-interval`` (fairseq averages the norm it logs in "train_inner"), and its
    ``epoch_ends`` end-of-epoch "train" lines, the means over whole epochs, were left out."""
    notes = [("fairseq's gnorm is the mean over each logging interval (--log-interval; its TensorBoard and "
              "W&B logs too): a spike inside one is averaged into it, so clip rates are understated; "
              "--log-interval 1 logs every update's norm")]
    if epoch_ends:
        notes.append(f"{epoch_ends} end-of-epoch 'train' line(s) left out: each gives the epoch's mean norm, "
                     "not a step's")
    return notes


# Where str.splitlines() ends a line besides "\n" (and in a text that is not ASCII, also \x85, \u2028, \u2029)
_OTHER_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e"


def _newline_lines(text: str) -> str:
    """``text`` with every line break ``str.splitlines()`` knows made "\n" (\r\n as one): the same lines,
    found by ``str.find`` (a pattern of the line breaks is 10x slower than the rest of the reader). The
    usual log, whose lines end in "\n" only, is given back as it is (six searches for the others); another
    is a copy per kind of break it holds (its lines split and joined again held them all: a 10^6-line log
    with "\r\n" 1.07 GB). The compiled reader's ``newline_lines`` does it in two passes where built (a
    10^6-line tqdm log, its updates after carriage returns, its bar's blocks: 0.61 -> 0.25 s)."""
    from .compiled import log_readers

    readers = log_readers()
    if readers is not None and hasattr(readers, "newline_lines"):
        done = readers.newline_lines(text)
        if done is not None:
            return done
    breaks = _OTHER_BREAKS if text.isascii() else _OTHER_BREAKS + "\x85\u2028\u2029"
    for c in breaks:
        if c in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n") if c == "\r" else text.replace(c, "\n")
    return text


def _line_at(text: str, pos: int) -> tuple[str, int]:
    """The line of ``text`` (see :func:`_newline_lines`) that starts at ``pos``, lowercased, and where the
    next one starts: taken from 0 on, the lines ``text.lower().splitlines()`` gives, one at a time (so
    that the compiled reader can read runs of them from the text itself)."""
    if (end := text.find("\n", pos)) < 0:
        return text[pos:].lower(), len(text)
    return text[pos:end].lower(), end + 1


def _text_records(text: str, bare: bool,
                  llmc: bool) -> tuple[list[dict[str, Any] | tuple[str, ...] | _Run], _LineTemplate | None]:
    """The records (step, grad_norm, loss, learning_rate) of a text log's lines (``text.lower()
    .splitlines()``; every line break of ``text`` a "\n": see :func:`_newline_lines`): see
    :func:`read_text_log`; ``bare``: the norm named just "norm" (:data:`_BARE_NORM`);
    ``llmc``: lines may be llm.c's ``s:100 trl:3.2 ...``. A line of the same text as an earlier step's
    line but for its numbers is read by one match of that line's :class:`_LineTemplate`, as the patterns
    would read it: its record is the numbers the template captured (a tuple), or, for a run of such lines
    the compiled reader read from the text, a :class:`_Run` of them; the template given beside the records."""
    records: list[dict[str, Any] | tuple[str, ...] | _Run] = []
    block: dict[str, Any] | None = None  # the record of the last step line, filled by the lines under it
    template: _LineTemplate | None = None
    tried = hits = 0  # lines the template was tried on since it was made, and how many it read
    misses = 0  # the norm lines it did not read since the last it read: past 16, the format changed (a
    # tqdm bar's next block; counted from the lines tried alone, 10^5 lines read first kept a template
    # that read no more for 2 x 10^5 lines, each tried before the patterns read it)
    wait = backoff = 0  # norm lines to read before the next try to make one, when the last try failed
    scan = _template_text()
    runs = scan is None or not text.isascii()  # the template's pattern reads runs of lines (see below)
    pos, n = 0, len(text)
    while pos < n:
        start = pos
        line, pos = _line_at(text, pos)
        # (a template of lines without a step reads a line only as a record of its own: none before it
        # waits for its norm, as a step line's does)
        if template is not None and "norm" in line and (
                template.stepped or block is None or "grad_norm" in block):
            if scan is not None and template.ops is not None:  # the compiled reader reads a run of lines
                _, resume, rows = scan(template.ops, text, start, template.out, not template.stepped)
                if rows:
                    records.append(_Run(template, rows))
                    tried, hits, block, misses = tried + rows, hits + rows, None, 0
                    pos = resume  # (the lines after the last it read may start a block: read here)
                    continue
            if runs or template.ops is None:  # the template's pattern reads a run of lines, a window of
                # the text at a time (where the compiled reader does not: lines of ASCII)
                sink = _RunSink(template, records)
                _, resume = template.run(text, start, sink=sink)
                if sink.read:
                    tried, hits, block, misses = tried + sink.read, hits + sink.read, None, 0
                    pos = resume
                    continue
            tried, misses = tried + 1, misses + 1
            if (t := template.pattern.fullmatch(line)) is not None:
                hits, misses = hits + 1, 0
                records.append(t.groups())
                block = None
                continue
        # each pattern needs its word: a line without it (a chatty log's warnings, OLMo's other
        # metrics) runs no pattern (2-3x faster)
        m = None if "norm" not in line else _BARE_NORM.search(line) if bare else _text_norm(line)
        s = _text_step(line, llmc)
        if m is None:
            if s is not None:
                block = {"step": s}
            elif block is not None:
                _text_loss_and_lr(block, line, llmc)
            continue
        if s is not None:  # a record on one line
            r = {"step": s}
            block = None
        elif block is not None and "grad_norm" not in block:
            r = block
        else:
            r, block = {}, None
        r["grad_norm"] = float(m.group(m.re.groups).replace(",", ""))  # the value is the last group
        _text_loss_and_lr(r, line.replace(m.group(0), ""), llmc)
        records.append(r)
        remake = template is None or tried > 2 * hits + 16 or misses > 16
        if r is not block and not bare and not llmc and remake:
            if (wait := wait - 1) < 0:  # no template, or one that no longer fits (the format changed)
                if template is not None:
                    template.as_runs(records)
                template, tried, hits, misses = _LineTemplate.of(line, m), 0, 0, 0
                t = template.pattern.fullmatch(line) if template is not None else None
                if t is None:  # none, or one that does not read even its own line: tried again later
                    template = None
                else:
                    records[-1] = t.groups()  # the line it was made from: the same record, as the others
                    template.first = len(records) - 1
                backoff = 0 if template is not None else min(2 * backoff + 1, 1024)
                wait = backoff
    return records, template


def _template_text() -> Any:
    """The compiled reader of lines by a template (``template_text``, gradtool/io/_logscan.c), or None
    (see :mod:`~gradtool.io.compiled`)."""
    from .compiled import log_readers

    readers = log_readers()  # (one built before the bar's op, (4,), is left unused: an editable install
    # not built again)
    return None if readers is None or not hasattr(readers, "TEMPLATE_BAR") else readers.template_text


class _Run:
    """A run of lines the compiled reader read by ``template``: its next ``rows`` rows of numbers (in
    ``template.out``)."""

    __slots__ = ("template", "start", "stop")

    def __init__(self, template: _LineTemplate, rows: int) -> None:
        self.template, self.stop = template, template.rows + rows
        self.start, template.rows = template.rows, self.stop


class _RunSink:
    """A ``sink`` for :meth:`_LineTemplate.run`: each window's rows appended to ``records`` as a
    :class:`_Run` of their numbers (converted as :meth:`_LineTemplate.columns` converts them, kept in the
    template's ``out``), not as tuples of strings (10^6 Megatron lines without the compiled reader: 811 ->
    ~500 MB); as the tuples when they are fewer than RUN_ROWS (a run cut short every few lines: the
    conversion costs more than it saves) or a step does not fit int64 (the general reader's then).
    ``read``: the rows so far."""

    RUN_ROWS = 256

    def __init__(self, template: _LineTemplate, records: list[Any]) -> None:
        self.template, self.records, self.read = template, records, 0

    def __call__(self, rows: list[tuple[str, ...]]) -> None:
        self.read += len(rows)
        if len(rows) < self.RUN_ROWS:
            self.records.extend(rows)
            return
        try:
            self.template.add_run(rows, self.records)
        except OverflowError:
            self.records.extend(rows)


# A number of a line that a template may vary: _NUMBER, but not right after a letter, digit, "_" or "."
# ("l2_norm", "group0", "fp16" stay text). A template's slot takes a sign only where the line it was made
# from had one, and the spaces next to a slot may be any number but none (numbers padded to a width).
_SLOT = re.compile(rf"(?<![a-z_\d.]){_NUMBER}")
_SPACES_AROUND = re.compile(r"^( *)(.*?)( *)$", re.DOTALL)
_TEMPLATE_FIELDS = ("step", "grad_norm", "loss", "learning_rate")
_TEMPLATE_LINE_MAX = 4096  # longer lines make no template (its pattern compiled again and again, if a
# hostile log's lines each differ: the patterns read them, as they read every line before templates)
_WORDS_READ = {"grad_norm": "nan|inf(?:inity)?", "loss": "nan|inf"}  # as _TEXT_NORM and _TEXT_LOSS read them
# A progress bar's cells between two "|": tqdm's eighths of a block (U+2588-U+258F; any block element,
# U+2580-U+259F, is taken), its ascii=True cells " 123456789#", spaces. A template leaves them free
# (``_BAR_CELLS``; the compiled reader's op (4,)): no pattern of the reader reads a word or a number there
# (they have no letter, "0" nor "."), and a bar's every state made a template of its own, each a regular
# expression to compile (a 10^6-line tqdm log: ~80 of them, 0.7 s of 3.1)
_BAR_CELLS = "[ #1-9\u2580-\u259f]*+"
_BAR = re.compile(f"(?<=\\|){_BAR_CELLS}(?=\\|)")  # (a bar only if _BAR_FILLED finds a "#" or a block in it)
_BAR_FILLED = re.compile("[#\u2580-\u259f]")


class _LineTemplate:
    """A line of a text log (lowercased) as a pattern: its text fixed, each number (:data:`_SLOT`) free,
    as atomic groups, so that a line it matches has the same text around numbers that match where the
    line's did; the numbers the patterns read (step, norm, loss, learning rate) are captured. Such a line
    is read by the patterns of :func:`_text_records` from the same places (every pattern starts at a word
    of the fixed text, and the numbers match _NUMBER whole), so the captured numbers are its record, with
    one match instead of five searches and the reader's Python per line (a Megatron line ~9 -> ~2 us)."""

    def __init__(self, pattern: re.Pattern[str], fields: tuple[str, ...], commas: bool,
                 ops: tuple[tuple[Any, ...], ...] | None = None) -> None:
        # pattern: a line's text, then its end ("\n" or the end of the text), so that fullmatch reads one
        # line and match the line at a position of a text; fields: the names of its groups, in the line's order
        self.pattern, self.commas = pattern, commas
        self.order = [(k, fields.index(k)) for k in _TEMPLATE_FIELDS if k in fields]  # the reader's order
        self.stepped = "step" in fields  # (else a template of lines without a step: see of)
        # the pattern as the compiled log reader's operations (template_text in gradtool/io/_logscan.c):
        # (0, text), (1,) for " +", (2, captured, signed, words, step, commas) for a number
        self.ops = ops
        # the numbers the compiled reader read by the template: a bytearray per field (the line's order) of
        # int64 (the step) or float64, and how many rows they hold (see _Run)
        self.out = [bytearray() for _ in fields]
        self.kinds = ["<i8" if k == "step" else "<f8" for k in fields]
        self.rows = 0
        self.first = 0  # the record of the line it was made from (see as_dicts)

    @classmethod
    def of(cls, line: str, m: re.Match[str]) -> _LineTemplate | None:
        """The template of a norm line with its step, or of one without a step nor any word of one
        (``m``: its norm, from :func:`_text_norm`), or None when its values are not each one whole number
        of it, or the line is not one the argument above covers: one "norm" (the rest of the line is read
        without its norm, cut once), no clipping words (another reading of the norm), two numbers with
        nothing between them; or longer than ``_TEMPLATE_LINE_MAX``. A line without a step's words
        (those :func:`_text_step` looks for) makes a template of lines that have none either (a number
        makes none of them: no letter but an exponent's "e", after a digit): a custom loop's tqdm
        updates, ``... loss=2.5, grad_norm=1.2]`` (10^6 of them 4.6 -> 1.05 s). Its runs end at the first
        line it does not match (the compiled reader's too, ``strict``, which else passes over lines
        without "norm": a step line among them would make the norm line after it that step's)."""
        if len(line) > _TEMPLATE_LINE_MAX or line.count("norm") != 1 or "clip" in line or "raw" in line:
            return None
        cued = "iter" in line or "step" in line or "num_updates" in line
        s = _TEXT_STEP.search(line) if cued else None
        if s is None and (cued or "(train)" in line or "[batch=" in line):
            return None
        cut, width = m.start(), len(m.group(0))
        rest = line.replace(m.group(0), "")
        lo = _TEXT_LOSS.search(rest) if "loss" in rest else None
        lr = _TEXT_LR.search(rest) if ("learning rate" in rest or "lr" in rest) else None

        def in_line(span: tuple[int, int]) -> tuple[int, int] | None:
            a, b = span  # a span of the line without its norm, in the line (None: it spans the cut)
            return (a, b) if b <= cut else (a + width, b + width) if a >= cut else None

        read = {m.span(m.re.groups): "grad_norm"} | ({} if s is None else {s.span(1): "step"})
        for found, name in ((lo, "loss"), (lr, "learning_rate")):
            if found is not None:
                read[in_line(found.span(1))] = name  # type: ignore[index]
        slots = list(_SLOT.finditer(line))
        if None in read or not set(read) <= {t.span() for t in slots}:
            return None
        bars = [b.span() for b in _BAR.finditer(line) if _BAR_FILLED.search(b.group())
                and not any(b.start() <= a < b.end() for a, _ in read)] if "|" in line else []
        if bars:  # its cells free; its ascii digits no slots (no value the reader reads lies in a bar)
            slots = [t for t in slots if not any(a <= t.start() < b for a, b in bars)]
        pieces, fields, pos = [], [], 0
        ops: list[tuple[Any, ...]] = []
        # thousands commas: "1,234" split as two slots by ",", or one slot ("tps: 1,234" before a space)
        commas = any(line.startswith(",", t.end()) or "," in t.group() for t in slots)
        for t in slots:
            if t.start() == pos and pos:  # two numbers with nothing between
                return None
            _add_between(pieces, ops, line, pos, t.start(), pos > 0, True, bars)
            name = read.get(t.span())
            sign = "[-+]" if t.group()[0] in "+-" else ""
            ops.append((2, bool(name), bool(sign) and name != "step", 2 if name == "grad_norm" else
                        1 if name == "loss" else 0, name == "step", commas))
            # as _NUMBER matches: its first alternative (a number with thousands commas) can match
            # only where a slot holds or is followed by a ","; else its second, greedy, is as matched
            # possessively
            body = (r"\d++" if name == "step" else f"(?>{sign}{_UNSIGNED})" if commas else
                    rf"{sign}\d++\.?+\d*+(?:[eE][-+]?\d+)?+")
            if name in _WORDS_READ:  # the words the pattern reads there besides a number
                body = f"(?>{body}|{_WORDS_READ[name]})"
            pieces.append(f"({body})" if name else body)
            if name:
                fields.append(name)
            pos = t.end()
        _add_between(pieces, ops, line, pos, len(line), bool(slots), False, bars)
        # one pattern for a line (fullmatch) and for a run of lines (match, up to the line's end): both
        # compiles were ~11 ms for a tqdm line, one template a bar state, ~80 of them in a 10^6-line log
        return cls(re.compile(rf"(?:{''.join(pieces)})(?:\n|\Z)"), tuple(fields), commas, tuple(ops))

    def run(self, text: str, pos: int, window: int = 1 << 22, first: int = 1 << 12,
            sink: Any = None) -> tuple[list[tuple[str, ...]], int]:
        """The lines of ``text`` from ``pos`` on that the template matches, one after another: what its
        pattern's ``fullmatch`` gives each line of them lowercased (its groups), and where the first line
        it does not match starts. One match a line over a lowercased window of lines, not a slice, a
        lowercasing and a search of the reader's a line (10^6 Megatron lines without the compiled reader
        4.36 -> 3.85 s end to end). The window grows from about ``first`` characters, doubling while every
        line of it matches, to about ``window``: a run cut short by another kind of line (a log's timers
        every few steps) costs its own lines, not a whole window (100,000 lines with a timer line every
        five: 25 -> 0.5 s). A window that lowercasing makes longer (a dotted capital I is two characters
        lowercased) ends the run where it starts: its lines are not where the lowercased window has them.
        ``sink``: called with each window's rows instead of gathering them (none given back)."""
        match = self.pattern.match  # (the pattern ends at the end of a line: see of)
        got: list[tuple[str, ...]] = []
        n, size = len(text), first
        while pos < n:
            end = text.find("\n", min(pos + size, n) - 1)
            end = n if end < 0 else end + 1
            lowered = text[pos:end].lower()
            if len(lowered) != end - pos:  # (every character one character lowercased: lines in place)
                break
            at = 0
            start = len(got)
            while (m := match(lowered, at)) is not None and m.end() > at:
                got.append(m.groups())
                at = m.end()
            if sink is not None and len(got) > start:
                sink(got[start:])
                del got[start:]
            pos += at
            if at < len(lowered):
                break
            size = min(2 * size, window)
        return got, pos

    def columns(self, rows: list[tuple[str, ...]]) -> dict[str, list[Any]]:
        """The numbers the template captured in ``rows``, by field in the reader's order, as the reader
        converts them: the step by ``int``, the others by ``float`` (thousands commas dropped). A field's
        strings are taken by ``itemgetter``: ``zip(*rows)`` makes an iterator a row, and the collector runs
        over them (10^6 Megatron rows: 0.56 -> 0.1 s)."""
        from operator import itemgetter

        captured = {i: list(map(itemgetter(i), rows)) for _, i in self.order}
        return {k: list(map(int, captured[i])) if k == "step" else
                [float(v.replace(",", "")) for v in captured[i]] if self.commas else
                list(map(float, captured[i])) for k, i in self.order}

    def run_columns(self, run: _Run) -> dict[str, Any]:
        """The numbers of ``run`` (read by the compiled reader), by field in the reader's order: NumPy
        arrays of int64 steps and float64 values (copies)."""
        import numpy as np

        return {k: np.frombuffer(self.out[i], self.kinds[i])[run.start:run.stop].copy()
                for k, i in self.order}

    def as_dicts(self, records: list[Any], start: int | None = None) -> None:
        """The rows this template captured among ``records`` (tuples), and the runs of every template
        (from ``start``, default ``first``, the record of the line it was made from, on), made the
        reader's dicts (Python ints and floats), in place."""
        start = self.first if start is None else start
        at = [i for i in range(start, len(records)) if type(records[i]) is tuple]
        if at:
            columns = self.columns([records[i] for i in at])
            for j, i in enumerate(at):
                records[i] = {k: col[j] for k, col in columns.items()}
        if any(type(r) is _Run for r in islice(records, start, None)):
            expanded: list[Any] = records[:start]
            for r in islice(records, start, None):
                if type(r) is _Run:
                    columns = {k: col.tolist() for k, col in r.template.run_columns(r).items()}
                    expanded.extend({k: col[j] for k, col in columns.items()}
                                    for j in range(r.stop - r.start))
                else:
                    expanded.append(r)
            records[:] = expanded

    def as_runs(self, records: list[Any]) -> None:
        """The rows this template captured among ``records`` as tuples (from ``first`` on) made runs of
        their numbers, in place, when it is replaced: its records stay columns, for :meth:`history` of
        records of several templates (a tqdm bar's 80 blocks, 80 templates: made dicts at each
        replacement, 1.7 s of 10^6 lines); as dicts where a step does not fit int64 (the patterns' then)."""
        kept: list[Any] = records[:self.first]
        group: list[tuple[str, ...]] = []
        try:
            for r in islice(records, self.first, None):
                if type(r) is tuple:
                    group.append(r)
                    continue
                self.add_run(group, kept)
                group = []
                kept.append(r)
            self.add_run(group, kept)
        except OverflowError:
            self.as_dicts(records)
            return
        records[:] = kept

    def add_run(self, rows: list[tuple[str, ...]], records: list[Any]) -> None:
        """``rows`` (tuples this template captured) appended to ``records`` as one run of their numbers
        (converted as :meth:`columns` converts them, kept in ``out``); OverflowError, nothing appended,
        where a step does not fit int64."""
        import numpy as np

        if rows:
            columns = self.columns(rows)
            arrays = [(i, np.asarray(columns[k], self.kinds[i])) for k, i in self.order]
            for i, a in arrays:
                self.out[i] += a.tobytes()
            records.append(_Run(self, len(rows)))

    def history(self, records: list[Any], path: str) -> NormHistory | None:
        """The history of a log's records (what :func:`from_records` makes of their dicts, from columns):
        tuples this template read, runs of any template and the patterns' dicts, when they all hold this
        template's fields (the records of lines all with a step, or all without); None when they do not
        make one that way."""
        import numpy as np

        from .logs import _columns, _with_others

        names = [k for k, _ in self.order]
        fields = set(names)
        parts: dict[str, list[Any]] = {k: [] for k in names}
        kinds = list(map(type, records))  # (the next record of another kind found by a binary search)
        changes = [i for i in range(1, len(kinds)) if kinds[i] is not kinds[i - 1] or kinds[i] is _Run] \
            if len(set(kinds)) > 1 or _Run in kinds else []
        changes.append(len(records))
        at = 0
        while at < len(records):
            end = changes[bisect.bisect_right(changes, at)]
            try:
                if kinds[at] is _Run:
                    if [k for k, _ in records[at].template.order] != names:
                        return None
                    got = records[at].template.run_columns(records[at])
                elif kinds[at] is tuple:  # tuples the pattern read: converted as the reader converts them
                    got = {k: np.asarray(col, dtype=np.int64 if k == "step" else np.float64)
                           for k, col in self.columns(records[at:end]).items()}
                else:  # the patterns' dicts: the same fields (a line of the template's kind)
                    if any(r.keys() != fields for r in records[at:end]):
                        return None
                    got = {k: np.asarray([r[k] for r in records[at:end]],
                                         dtype=np.int64 if k == "step" else np.float64) for k in names}
            except OverflowError:  # a step beyond int64: the general reader's
                return None
            at = end
            for k, col in got.items():
                parts[k].append(col)
        columns = {k: np.concatenate(col) for k, col in parts.items()}
        fast = _columns(columns.get("step"), columns["grad_norm"], columns.get("loss"),
                        columns.get("learning_rate"), types_known=True, lists=False)
        if fast is None:
            return None
        hist = _with_others(_noted(NormHistory(*fast[:4], path, "grad_norm", "text", fast[4]), fast[5]),
                            columns, "grad_norm")
        return hist if self.stepped else _in_line_order(hist, path, len(columns["grad_norm"]), 0)


def _add_between(pieces: list[str], ops: list[tuple[Any, ...]], line: str, a: int, b: int, after_slot: bool,
                 before_slot: bool, bars: list[tuple[int, int]]) -> None:
    """The pattern (to ``pieces``) and operations (to ``ops``) of ``line[a:b]``, the fixed text between
    two numbers (:func:`_text_between`, :func:`_between_ops`), but for the cells of the progress ``bars``
    (spans) in it: :data:`_BAR_CELLS`, op (4,)."""
    inside = [(c, d) for c, d in bars if a <= c and d <= b]
    starts, stops = [a] + [d for _, d in inside], [c for c, _ in inside] + [b]
    for k, (c, d) in enumerate(zip(starts, stops)):
        if k:
            pieces.append(_BAR_CELLS)
            ops.append((4,))
        first, last = k == 0, k == len(inside)
        pieces.append(_text_between(line[c:d], after_slot and first, before_slot and last))
        ops.extend(_between_ops(line[c:d], after_slot and first, before_slot and last))


def _text_between(text: str, after_slot: bool, before_slot: bool) -> str:
    """The pattern of a line's fixed ``text`` between numbers: itself, but for its runs of spaces next to
    a number (``after_slot``: it follows one; ``before_slot``: one follows it), any number but none."""
    lead, middle, trail = _SPACES_AROUND.fullmatch(text).groups()  # type: ignore[union-attr]
    if not middle:  # spaces only
        return " +" if text and (after_slot or before_slot) else re.escape(text)
    return ((" +" if lead and after_slot else re.escape(lead)) + re.escape(middle)
            + (" +" if trail and before_slot else re.escape(trail)))


def _between_ops(text: str, after_slot: bool, before_slot: bool) -> list[tuple[Any, ...]]:
    """:func:`_text_between` as template operations: (0, text as UTF-8) and (1,) for a run of spaces."""
    lead, middle, trail = _SPACES_AROUND.fullmatch(text).groups()  # type: ignore[union-attr]
    if not middle:
        parts: list[Any] = [1] if text and (after_slot or before_slot) else [text]
    else:
        parts = [1 if lead and after_slot else lead, middle, 1 if trail and before_slot else trail]
    ops: list[tuple[Any, ...]] = []
    for part in parts:
        if part == 1:
            ops.append((1,))
        elif part:
            ops.append((0, part.encode()))
    return ops


def _text_history(records: list[Any], path: str, template: _LineTemplate | None = None) -> NormHistory:
    """The history of a text log's ``records``: by their steps, or by their order when most have none;
    ``template``: the one that read the records that are tuples or runs (see :func:`_text_records`: an
    earlier template's were made dicts when it was replaced)."""
    if template is not None:
        if (hist := template.history(records, path)) is not None:
            return hist
        template.as_dicts(records, 0)
    n, with_step = len(records), sum("step" in r for r in records)
    if with_step * 2 >= n:  # most give their step: the others (a warning naming the norm) are left out
        hist = from_records([r for r in records if "step" in r], path, "text", "grad_norm")
        if with_step < n:
            hist.notes.append(f"{path}: {n - with_step} of {n} gradient-norm lines have no step number and "
                              "are left out")
        return hist
    for r in records:
        r.pop("step", None)
    return _in_line_order(from_records(records, path, "text", "grad_norm"), path, n, with_step)


def _in_line_order(hist: NormHistory, path: str, n: int, with_step: int) -> NormHistory:
    """``hist`` of ``n`` norm lines, ``with_step`` of them with a step, read in the order of the lines."""
    hist.line_order = True
    hist.notes.append(f"{path}: {n - with_step} of {n} gradient-norm lines have no step number: steps are "
                      "the order of those lines (0, 1, 2, ...), not training steps")
    return hist


def _text_step(line: str, llmc: bool = False) -> int | None:
    """The step number of ``line`` (lowercased), if it has one: ``iteration 100/ 1000``, ``step: 10``,
    ``[step=100/3000]``, ``num_updates 100``, MMEngine's ``Iter(train) [100/1000]`` and ``Epoch(train)
    [2][100/270]`` (step 370: its epochs are counted from 1), Composer's ``[batch=100/3000]:`` or llm.c's
    ``s:100``."""
    if ("iter" in line or "step" in line or "num_updates" in line) and (s := _TEXT_STEP.search(line)):
        return int(s.group(1))
    if "(train)" in line and (s := _MMENGINE_STEP.search(line)):
        epoch, i, per_epoch, it = s.groups()
        return int(it) if it is not None else (int(epoch) - 1) * int(per_epoch) + int(i)
    if llmc and line.startswith("s:") and (s := _LLMC_STEP.match(line)):
        return int(s.group(1))
    return int(s.group(1)) if "[batch=" in line and (s := _BATCH_HEADER.search(line)) else None


def _text_norm(line: str) -> re.Match[str] | None:
    """The gradient norm on ``line`` (lowercased): the one named as taken before clipping
    (``raw_grad_norm: 3.4``) if there is one, else the first not named as clipped (``clipped grad norm:
    1.0`` never exceeds the threshold in use)."""
    if "clip" not in line and "raw" not in line:  # the usual line: the first norm (a pattern 3x faster)
        m = _TEXT_NORM.search(line, max(0, line.find("norm") - _NORM_WORD_AT))
        while m is not None and line[max(0, m.start() - 4):m.start()] in ("max_", "max-", "max "):
            m = _TEXT_NORM.search(line, m.end())  # max_grad_norm=1.0, a printed setting: no norm value
        return m
    found = [(m, _clip_words(m.group(1) + m.group(2))) for m in _TEXT_NORM_NAMED.finditer(line)
             if "max" not in re.split(r"[^a-z]+", m.group(1))]  # not a max_grad_norm setting
    return (next((m for m, c in found if c == "before"), None)
            or next((m for m, c in found if c != "after"), None))


def _text_loss_and_lr(record: dict[str, Any], line: str, llmc: bool = False) -> None:
    """The loss and learning rate on ``line`` (lowercased) into ``record``, unless it has them (the first
    one counts: OLMo prints its cross-entropy loss before its Z loss)."""
    if "loss" not in record and (lo := _TEXT_LOSS.search(line) if "loss" in line else
                                 _LLMC_LOSS.search(line) if llmc and line.startswith("s:") else None):
        record["loss"] = float(lo.group(1).replace(",", ""))
    if "learning_rate" not in record and ("learning rate" in line or "lr" in line) and (
            lr := _TEXT_LR.search(line)):
        record["learning_rate"] = float(lr.group(1).replace(",", ""))


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal colours and cursor moves


def without_terminal_codes(text: str) -> str:
    """``text`` without its terminal colours and cursor moves (``re.sub`` of :data:`_ANSI`): by the compiled
    ``without_ansi`` where built (a memchr per escape, one copy: 0.3 s for torchtitan's 10^6 coloured
    lines, where ``re.sub``'s six million matches take 3 s), else ``re.sub``. (A NumPy pass over the
    bytes, the escapes' windows gathered, was measured no faster than ``re.sub``.)"""
    if "\x1b" not in text:
        return text
    from .compiled import log_readers

    readers = log_readers()
    return _ANSI.sub("", text) if readers is None else readers.without_ansi(text)
_VALUE_IN_CELL = re.compile(r"[:=]\s*[-+]?\d|[\x00-\x08\x0b-\x1f]")  # "grad_norm: 1.2", ANSI colours


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True


def _csv_header_like(first: str, key: str | None) -> bool:
    """True when ``first`` reads as a CSV/TSV header naming a gradient-norm column: a text log line with
    commas in it ("10:00:00,000 ... grad_norm: 1.2 ... tps: 1,234") holds its values in its cells."""
    cells = re.split(r"[,\t]", first)
    nkey = _find_norm_key(cells, key)
    return (nkey is not None and _VALUE_IN_CELL.search(nkey) is None
            and _TEXT_NORM.search(nkey.lower()) is None)  # "grad_norm tensor(1.2, device='cuda:0')"
