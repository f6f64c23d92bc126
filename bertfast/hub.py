"""Hugging Face Hub ids: a model id (``"sentence-transformers/all-MiniLM-L6-v2"``)
resolved to a snapshot folder of the standard Hugging Face cache, through
``huggingface_hub`` (the cache transformers and sentence-transformers use, so a model
either of them downloaded is found without a second download).

:func:`resolve` is the one entry: an existing local folder is that folder; a string
shaped like a Hub id that is no local path is downloaded (or found in the cache) with
``revision``, ``token`` and ``cache_dir``; anything else is checked as a folder (and
refused as one). Only what bertfast reads is downloaded (:data:`SNAPSHOT_FILES`): the
config, the safetensors weights, the tokenizer files and the sentence-transformers
module files; ``pytorch_model.bin`` only when the repository has no safetensors
weights (it is read with ``torch.load(weights_only=True)``, never unpickled freely).
``HF_HUB_OFFLINE=1``, or no network: a cached model loads, an uncached one is one
:class:`~bertfast.validate.CheckpointNotFoundError` line naming the id. The snapshot
is then checked as any checkpoint folder is (its files are links into the cache's
``blobs``, which the containment rules of :func:`bertfast.validate.checkpoint_file`
allow, and nothing else outside the snapshot).
"""

from __future__ import annotations

import os
import re

from .validate import (
    CheckpointError,
    CheckpointNotFoundError,
    checkpoint_folder,
    short_repr,
)

#: What bertfast reads from a repository (``huggingface_hub`` patterns, matched
#: against the path in the repository: ``model*.safetensors`` is the top folder only).
SNAPSHOT_FILES = [
    "config.json",
    "model*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "modules.json",
    "config_sentence_transformers.json",
    "sentence_bert_config.json",
    "*_Pooling/config.json",
    "*_Normalize/*.json",
]
#: The PyTorch weights, fetched only when a repository has no safetensors weights.
BIN_FILES = ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin"]

# A Hub id: "name" or "namespace/name" (letters, digits, "-", "_", "."; no "--" or ".."
# inside, not starting or ending with "-" or "."), as huggingface_hub validates them.
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")


def is_hub_id(text) -> bool:
    """Whether ``text`` is shaped like a Hub model id (and is not "." or "..")."""
    return (
        isinstance(text, str)
        and bool(_HUB_ID.match(text))
        and "--" not in text
        and ".." not in text
        and not text.endswith((".", "-"))
    )


def resolve(path, *, revision: str | None = None, token=None, cache_dir=None) -> str:
    """The checkpoint folder ``path`` names: a local folder, or the cache snapshot of
    the Hub id ``path`` (downloaded when missing). ``revision`` (a branch, tag or
    commit), ``token`` (or ``HF_TOKEN`` / a saved login) and ``cache_dir`` (default:
    the standard cache, ``HF_HUB_CACHE``) apply to Hub ids only."""
    for name, value in (("revision", revision), ("cache_dir", cache_dir)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"{name} must be a string, not {type(value).__name__}")
    if token is not None and not isinstance(token, (str, bool)):
        raise TypeError(f"token must be a string or a bool, not {type(token).__name__}")
    local = isinstance(path, (str, os.PathLike, bytes)) and os.path.exists(
        os.path.expanduser(os.fsdecode(path))
    )
    if local or not is_hub_id(path):
        options = (("revision", revision), ("token", token), ("cache_dir", cache_dir))
        given = [name for name, value in options if value is not None]
        if given and local:
            raise ValueError(
                f"{', '.join(given)} apply to Hugging Face Hub ids; {os.fsdecode(path)} is a "
                "local folder"
            )
        return checkpoint_folder(path)
    return checkpoint_folder(_download(path, revision, token, cache_dir))


def _has_safetensors(folder: str) -> bool:
    return any(
        name.startswith("model") and name.endswith(".safetensors") for name in os.listdir(folder)
    )


def _download(repo_id: str, revision, token, cache_dir) -> str:
    try:
        import huggingface_hub
        from huggingface_hub import constants, errors
    except ImportError:  # pragma: no cover - a dependency of tokenizers
        raise CheckpointNotFoundError(
            f"{repo_id} is no local folder, and huggingface_hub (to download Hub ids) is "
            "not installed: pip install huggingface_hub, or pass a checkpoint folder"
        ) from None
    at = f"{repo_id}" + (f" (revision {revision!r})" if revision else "")
    cache = os.fspath(cache_dir) if cache_dir is not None else constants.HF_HUB_CACHE

    def fetch(local_only):
        def snapshot(patterns):
            return huggingface_hub.snapshot_download(
                repo_id,
                revision=revision,
                token=token,
                cache_dir=cache_dir,
                allow_patterns=patterns,
                local_files_only=local_only,
                library_name="bertfast",
            )

        folder = snapshot(SNAPSHOT_FILES)
        if not _has_safetensors(folder):  # an older repository: its PyTorch weights
            folder = snapshot(SNAPSHOT_FILES + BIN_FILES)
        return folder

    try:
        try:
            folder = fetch(False)
        except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled):
            # The Hub cannot be reached: serve what the cache holds. Some huggingface_hub
            # versions (1.33) go to the Hub for a commit hash whose snapshot is cached
            # when the download left no tree listing (trees/<commit>.json) beside it.
            folder = fetch(True)
    except errors.GatedRepoError:
        raise CheckpointError(
            f"{at} is a gated model: accept its conditions on huggingface.co, then pass "
            "token= (or set HF_TOKEN, or run `hf auth login`)"
        ) from None
    except errors.RepositoryNotFoundError:
        raise CheckpointNotFoundError(
            f"no model {repo_id!r} on the Hugging Face Hub, or it is private (then pass "
            "token=, set HF_TOKEN or run `hf auth login`); no local folder has that name "
            "either"
        ) from None
    except errors.RevisionNotFoundError:
        raise CheckpointNotFoundError(
            f"{repo_id} has no revision {revision!r} on the Hub (a branch, tag or commit)"
        ) from None
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled):
        raise CheckpointNotFoundError(
            f"{at} is not in the Hugging Face cache ({cache}) and cannot be downloaded "
            "(offline: HF_HUB_OFFLINE is set, or the Hub cannot be reached): download it "
            f"once with network (e.g. `hf download {repo_id}`) or pass a checkpoint folder"
        ) from None
    except errors.HfHubHTTPError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"cannot download {at} from the Hub: {first}") from None
    except errors.HFValidationError as exc:
        raise CheckpointNotFoundError(
            f"{short_repr(repo_id)} is neither a local folder nor a valid Hub id: {exc}"
        ) from None
    return folder
