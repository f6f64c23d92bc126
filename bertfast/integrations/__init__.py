"""bertfast behind the embedding interfaces of other frameworks.

- :mod:`bertfast.integrations.langchain`: ``BertfastEmbeddings``, a
  ``langchain_core.embeddings.Embeddings`` (``pip install bertfast[langchain]``);
- :mod:`bertfast.integrations.llamaindex`: ``BertfastEmbedding``, a
  ``llama_index.core.embeddings.BaseEmbedding`` (``pip install bertfast[llamaindex]``).

Both are thin: the model, its loading options and the query / document prompts are
:mod:`bertfast.integrations._shared`'s, and every vector is ``Embedder.encode``'s.
Importing this package imports neither framework.
"""
