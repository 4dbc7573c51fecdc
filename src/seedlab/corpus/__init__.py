"""Token corpora (``seedlab corpus``): where text comes from (sources.py), how it becomes tokens
(tokenizers.py), the prepared folder (build.py) and the object studies read (corpus.py)."""

from seedlab.corpus.build import prepare
from seedlab.corpus.corpus import Corpus, count, find_sequence, iter_documents, load, occurrences, whole_word

__all__ = ["Corpus", "count", "find_sequence", "iter_documents", "load", "occurrences", "prepare", "whole_word"]
