"""Frozen-document retrieval: BM25 over a deterministic corpus of Python's own documentation.

The corpus is the docstrings of a fixed list of standard-library modules (`CORPUS_MODULES`): for
each module, its own docstring and the docstrings of its public classes and functions and of the
public methods those classes define. Every machine with Python has it, and for one Python build
it is the same bytes, so it is "frozen": the index records a SHA-256 `corpus_digest` over the
(doc id, text) pairs in order, and every retrieval result carries that digest, so a trace says
exactly which corpus answered. Docstrings differ between Python versions; the digest shows it.

The ranking is Okapi BM25 (k1 = 1.5, b = 0.75) computed with a sparse document × term weight
matrix (scipy), so a query costs one column slice and a row sum. Ties break by corpus order, so
results are deterministic.

Examples:
    >>> index = DocIndex([Document("a", "heap queue algorithm"), Document("b", "json encoder")])
    >>> [h.doc_id for h in index.search("heap", k=1)]
    ['a']
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from maserve_prefect.errors import ConfigError

CORPUS_MODULES: tuple[str, ...] = (
    "abc", "argparse", "array", "asyncio", "base64", "bisect", "calendar", "collections",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "doctest",
    "enum", "fnmatch", "fractions", "functools", "glob", "gzip", "hashlib", "heapq", "hmac",
    "html", "http.client", "inspect", "io", "ipaddress", "itertools", "json", "logging",
    "math", "operator", "os", "os.path", "pathlib", "pickle", "pprint", "queue", "random", "re",
    "secrets", "shlex", "shutil", "socket", "sqlite3", "statistics", "string", "struct",
    "subprocess", "tarfile", "tempfile", "textwrap", "threading", "time", "timeit", "typing",
    "unittest", "urllib.parse", "uuid", "weakref", "zipfile", "zlib",
)  # fmt: skip
"""The modules whose docstrings form the corpus; changing it changes every corpus digest."""

_STOPWORDS = frozenset(
    "a an and are as at be by for from has have if in is it its of on or that the this to was "
    "were which with what how does do can you i".split()
)
_TOKEN = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    """Lower-case alphanumeric runs minus stopwords (underscores and dots split words)."""
    return [t for t in _TOKEN.findall(text.lower()) if t not in _STOPWORDS]


@dataclass(frozen=True, slots=True)
class Document:
    """One corpus document: a dotted id (`json.dumps`) and its text."""

    doc_id: str
    text: str


@dataclass(frozen=True, slots=True)
class Hit:
    """One ranked document: id, BM25 score and the text (cut to `snippet_chars`)."""

    doc_id: str
    score: float
    text: str


class DocIndex:
    """A BM25 index over a fixed sequence of documents.

    Args:
        documents: the corpus, in a fixed order (the order breaks score ties).
        k1, b: BM25 parameters.
    """

    def __init__(self, documents: Sequence[Document], k1: float = 1.5, b: float = 0.75) -> None:
        if not documents:
            raise ConfigError("cannot index an empty corpus")
        self.documents: tuple[Document, ...] = tuple(documents)
        ids = [d.doc_id for d in self.documents]
        if len(set(ids)) != len(ids):
            raise ConfigError("corpus document ids must be unique")
        self.corpus_digest = corpus_digest(self.documents)
        vocab: dict[str, int] = {}
        rows: list[int] = []
        cols: list[int] = []
        for row, doc in enumerate(self.documents):
            for tok in tokenize(f"{doc.doc_id} {doc.text}"):
                rows.append(row)
                cols.append(vocab.setdefault(tok, len(vocab)))
        self._vocab = vocab
        tf = sp.coo_matrix(
            (np.ones(len(rows)), (rows, cols)), shape=(len(self.documents), len(vocab))
        ).tocsr()
        tf.sum_duplicates()
        doc_len = np.asarray(tf.sum(axis=1)).ravel()
        df = np.diff(tf.tocsc().indptr)
        idf = np.log1p((len(self.documents) - df + 0.5) / (df + 0.5))
        coo = tf.tocoo()
        norm = k1 * (1 - b + b * doc_len[coo.row] / doc_len.mean())
        weights = idf[coo.col] * coo.data * (k1 + 1) / (coo.data + norm)
        self._weights = sp.csc_matrix((weights, (coo.row, coo.col)), shape=tf.shape)

    def __len__(self) -> int:
        return len(self.documents)

    def search(self, query: str, k: int = 5, snippet_chars: int = 600) -> list[Hit]:
        """The `k` best documents for `query` (documents scoring 0 are left out)."""
        if k < 1:
            raise ConfigError(f"retrieval k must be >= 1, got {k}")
        term_ids = sorted({self._vocab[t] for t in tokenize(query) if t in self._vocab})
        if not term_ids:
            return []
        scores = np.asarray(self._weights[:, term_ids].sum(axis=1)).ravel()
        order = np.lexsort((np.arange(len(scores)), -scores))[:k]
        return [
            Hit(self.documents[i].doc_id, float(scores[i]), self.documents[i].text[:snippet_chars])
            for i in order
            if scores[i] > 0
        ]


def corpus_digest(documents: Iterable[Document]) -> str:
    """SHA-256 over the (doc id, text) pairs in order."""
    h = hashlib.sha256()
    for doc in documents:
        h.update(json.dumps([doc.doc_id, doc.text]).encode())
        h.update(b"\n")
    return h.hexdigest()


def _member_docs(module_name: str, obj: object) -> Iterable[Document]:
    module = obj
    public = getattr(module, "__all__", None)
    names = sorted(public) if public is not None else sorted(dir(module))
    own = getattr(module, "__name__", module_name)
    for name in names:
        if name.startswith("_"):
            continue
        member = getattr(module, name, None)
        if not (inspect.isclass(member) or inspect.isroutine(member)):
            continue
        # C accelerators define members in `_name` (bisect's functions live in `_bisect`).
        if public is None and getattr(member, "__module__", None) not in (own, f"_{own}"):
            continue
        doc = inspect.getdoc(member)
        if doc:
            yield Document(f"{module_name}.{name}", doc)
        if inspect.isclass(member):
            for meth_name, meth in sorted(vars(member).items()):
                if meth_name.startswith("_") or not inspect.isroutine(meth):
                    continue
                meth_doc = inspect.getdoc(meth)
                if meth_doc:
                    yield Document(f"{module_name}.{name}.{meth_name}", meth_doc)


def build_stdlib_corpus(modules: Sequence[str] = CORPUS_MODULES) -> tuple[Document, ...]:
    """The documents of `modules` (a module this build lacks is skipped; the digest shows it)."""
    docs: dict[str, Document] = {}
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        doc = inspect.getdoc(module)
        candidates = [Document(module_name, doc)] if doc else []
        candidates.extend(_member_docs(module_name, module))
        for d in candidates:
            docs.setdefault(d.doc_id, d)
    return tuple(docs.values())


@functools.cache
def stdlib_index() -> DocIndex:
    """The BM25 index over `build_stdlib_corpus()`, built once per process."""
    return DocIndex(build_stdlib_corpus())


@dataclass(frozen=True, slots=True)
class RetrievalResult:
    """Ranked hits plus the identity of the corpus that produced them."""

    query: str
    hits: tuple[Hit, ...]
    corpus_digest: str
    num_documents: int
    python_version: str

    def to_dict(self) -> dict[str, object]:
        """JSON-serializable form (tool output)."""
        return {
            "query": self.query,
            "hits": [{"doc_id": h.doc_id, "score": h.score, "text": h.text} for h in self.hits],
            "corpus_digest": self.corpus_digest,
            "num_documents": self.num_documents,
            "python_version": self.python_version,
        }


def retrieve(query: str, k: int = 5) -> RetrievalResult:
    """Top-`k` stdlib documentation passages for `query`, with the corpus digest.

    Examples:
        >>> result = retrieve("heap queue push pop smallest item", k=3)
        >>> any(h.doc_id.startswith("heapq") for h in result.hits), len(result.corpus_digest)
        (True, 64)
    """
    index = stdlib_index()
    version = ".".join(map(str, sys.version_info[:3]))
    return RetrievalResult(
        query, tuple(index.search(query, k)), index.corpus_digest, len(index), version
    )
