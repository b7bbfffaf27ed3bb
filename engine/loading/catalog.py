"""The model catalog: a few GGUF code models worth using, by name, each pinned to one file of a
Hugging Face repository at one commit, with its size and sha256.

`memosight model pull NAME` (or the editor's offer, server/model_offer.py) downloads the file into
`cache_root()/models/` with huggingface_hub's `hf_hub_download`, checks it, and moves it into place
whole; after that `model = "NAME"` loads it (engine/loading/gguf.py `gguf_file`). A file put there by
hand under the same name is found just the same. A file is checked in full (sha256) once: a small
marker beside it remembers the result for that size and modification time, and every later load
checks only the size and the marker.

No torch here, nor huggingface_hub at import: the server reads the names (config), and `memosight
model list` stays instant.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from ..protocol import EngineError, ModelLoadError
from .files import cache_root, digest_of

DEFAULT_ENDPOINT = "https://huggingface.co"
MARKER_SUFFIX = ".verified"  # beside the file: {"sha256", "size", "mtime_ns"} of the copy checked in full
# what a pull left before hf_hub_download did the transfer (listed as partial; the next pull removes it)
PART_SUFFIX = ".part"
STAGING_PREFIX = ".pull-"  # models/.pull-FILE/: one download's folder (hf_hub_download's local_dir), removed after


@dataclass(frozen=True)
class CatalogModel:
    name: str
    repo: str  # Hugging Face repository
    revision: str  # the commit the file is pinned at
    file: str  # the file's name, in the repository and in the cache
    sha256: str
    size: int  # bytes
    params: int  # parameters of the network the file holds (its output layer counted apart from the embedding)
    summary: str

    @property
    def path(self) -> Path:
        return models_dir() / self.file

    def url(self, endpoint: str | None = None) -> str:
        return (f"{endpoint or hub_endpoint()}/{self.repo}/resolve/{quote(self.revision, safe='')}/"
                f"{quote(self.file)}")

    def memory(self) -> dict[str, float]:
        """The memory a model takes once loaded, in GB (1e9 bytes). On a CPU's llama.cpp runtime (the
        default for these files) the file as it is, its 4,096-token KV cache and compute buffers: the
        0.5B's runtime measured 626 MB for its 491 MB file, so ~0.14 GB on top, scaled by parameters.
        On torch the weights dequantized: float32 on a CPU (engine/loading/gguf.py), bfloat16 on a GPU;
        the KV cache and the runtime come on top (a few hundred MB)."""
        return {"cpu_llamacpp_gb": round((self.size + 0.14e9 * max(1.0, self.params / 630e6)) / 1e9, 1),
                "cpu_float32_gb": round(self.params * 4 / 1e9, 1), "gpu_bfloat16_gb": round(self.params * 2 / 1e9, 1)}


# Both Qwen2.5-Coder models are fill-in-the-middle code models (<|fim_prefix|>, <|fim_suffix|>,
# <|fim_middle|>). `params`: for the 0.5B, counted in the file's tensors (it carries its output layer
# apart from the embedding: 630M, not the model card's 494M); for the 1.5B, the model card's 1.54B (a
# separate output layer, if its file carries one as the 0.5B's does, would add 0.23B).
CATALOG: dict[str, CatalogModel] = {
    model.name: model for model in (
        CatalogModel(
            name="qwen2.5-coder-0.5b",
            repo="Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
            revision="ebb2015119c907b064c512bf053e945850b5875f",
            file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491400064,
            params=630_167_424,
            summary="Qwen2.5-Coder 0.5B Instruct, 4-bit (Q4_K_M), Apache-2.0, fill-in-the-middle",
        ),
        CatalogModel(
            name="qwen2.5-coder-1.5b",
            repo="Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
            revision="f86cb2c1fa58255f8052cc32aeede1b7482d4361",
            file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1117320768,
            params=1_540_000_000,
            summary="Qwen2.5-Coder 1.5B Instruct, 4-bit (Q4_K_M), Apache-2.0, fill-in-the-middle",
        ),
    )
}


class PullError(EngineError):
    """A model could not be pulled; the message says what to do (often: where to put the file by hand)."""


def models_dir() -> Path:
    return cache_root() / "models"


def hub_endpoint() -> str:
    """The Hugging Face endpoint, read now (huggingface_hub reads HF_ENDPOINT once, at its import)."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as it is set now."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"}


def lookup(name: str) -> CatalogModel:
    if name not in CATALOG:
        raise ModelLoadError(f"{name!r} is not in the model catalog (known: {', '.join(CATALOG)}); "
                             "`memosight model list` shows them")
    return CATALOG[name]


def by_hand(model: CatalogModel) -> str:
    """Where to put the file without memosight's help."""
    return (f"download {model.url()} ({model.size:,} bytes, sha256 {model.sha256}) and put it at {model.path}, "
            f"then `memosight model pull {model.name}` checks it")


# --- checking a file ---------------------------------------------------------------------------

def sha256_of(path: Path) -> str:
    return digest_of(path, hashlib.sha256())


def _marker(path: Path) -> Path:
    return path.with_name(path.name + MARKER_SUFFIX)


def _stamp(path: Path) -> dict:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def marked_verified(model: CatalogModel, path: Path | None = None) -> bool:
    """Whether the file was checked in full as it is now (same size and modification time): cheap."""
    path = path or model.path
    try:
        marker = json.loads(_marker(path).read_text())
        return marker == {"sha256": model.sha256, **_stamp(path)} and marker["size"] == model.size
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _mark_verified(model: CatalogModel, path: Path) -> None:
    marker = _marker(path)
    try:
        staging = marker.with_name(f".{marker.name}.{os.getpid()}")
        staging.write_text(json.dumps({"sha256": model.sha256, **_stamp(path)}))
        os.replace(staging, marker)
    except OSError:  # a read-only cache: the file is checked in full at every load instead
        pass


def check(model: CatalogModel, path: Path | None = None) -> str | None:
    """None when the file is the catalog's (its sha256 computed once, then remembered); else what is
    wrong with it."""
    path = path or model.path
    size = path.stat().st_size
    if size != model.size:
        return f"it is {size:,} bytes, not {model.size:,}"
    if marked_verified(model, path):
        return None
    digest = sha256_of(path)
    if digest != model.sha256:
        return f"its sha256 is {digest}, not {model.sha256}"
    _mark_verified(model, path)
    return None


def state(model: CatalogModel) -> str:
    """For a listing, without reading the file: verified, unchecked (right size, sha256 not computed
    yet), wrong size, partial (left by an older version's pull; the next pull replaces it), missing."""
    path = model.path
    if path.is_file():
        if path.stat().st_size != model.size:
            return "wrong size"
        return "verified" if marked_verified(model) else "unchecked"
    part = path.with_name(path.name + PART_SUFFIX)
    if part.is_file():
        return f"partial ({part.stat().st_size * 100 // model.size}%)"
    return "missing"


def catalog_file(name: str) -> Path:
    """The checked file of a catalog model, for loading; a ModelLoadError says how to get it."""
    model = lookup(name)
    path = model.path
    if not path.is_file():
        raise ModelLoadError(f"model {name!r} is not downloaded yet: run `memosight model pull {name}`, or "
                             f"{by_hand(model)}")
    problem = check(model, path)
    if problem is not None:
        raise ModelLoadError(f"{path} is not the file of model {name!r} ({problem}): run `memosight model pull "
                             f"{name}` to download it again")
    return path


# --- pulling ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pulled:
    model: CatalogModel
    path: Path
    downloaded: bool  # False: it was there already, and checked
    checked_now: bool  # whether its sha256 was computed in this call (else remembered)

    def to_json(self) -> dict:
        return {"name": self.model.name, "path": str(self.path), "downloaded": self.downloaded,
                "checked_now": self.checked_now, "size": self.model.size, "sha256": self.model.sha256,
                "repo": self.model.repo, "revision": self.model.revision}


def pull(name: str, say: Callable[[str], None] = lambda message: None,
         progress: Callable[[int, int], None] | None = None) -> Pulled:
    """The file of catalog model `name` in place and checked: already there (no network), or
    downloaded now at the pinned revision. `say` hears status lines; `progress(done_bytes,
    total_bytes)` hears the transfer, from the thread that runs the pull (a bar on the command
    line, $/progress in the editor)."""
    model = lookup(name)
    path = model.path
    if path.is_file():
        remembered = marked_verified(model, path)
        if not remembered and path.stat().st_size == model.size:
            say(f"checking the sha256 of {path} (once)")
        problem = check(model, path)
        if problem is None:
            return Pulled(model, path, downloaded=False, checked_now=not remembered)
        say(f"{path} is not the file of {name} ({problem}); downloading it again")
    if hub_offline():
        raise PullError(f"cannot download {name}: HF_HUB_OFFLINE is set; {by_hand(model)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock, Timeout  # huggingface_hub's own dependency

    lock = FileLock(str(path.with_name(f".{path.name}.lock")), timeout=0)
    try:
        with lock:
            _download(model, say, progress)
    except Timeout:
        raise PullError(f"another `memosight model pull {name}` is downloading {path} now; wait for it to "
                        "finish") from None
    return Pulled(model, path, downloaded=True, checked_now=True)


def _network_error(exc: BaseException) -> bool:
    """Whether `exc` says the endpoint could not be reached or the transfer broke off."""
    from huggingface_hub.errors import OfflineModeIsEnabled

    module = type(exc).__module__.split(".")[0]
    return isinstance(exc, (OfflineModeIsEnabled, ConnectionError, TimeoutError)) or module in (
        "httpx", "httpx2", "httpcore", "requests", "urllib3")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class _Transfer:
    """How far a download is, heard through huggingface_hub's progress bars (`tqdm_class`), which
    draw nothing here: `progress` shows it. Over HTTP there is one bar; over Xet one counts the
    bytes received and one those written, so the furthest is taken."""

    def __init__(self, total: int, progress: Callable[[int, int], None] | None):
        self.total, self.progress = total, progress
        self.bars: list = []
        self.done = 0

    def heard(self) -> None:
        self.done = min(self.total, max((bar.count for bar in self.bars), default=0))
        if self.progress is not None:
            self.progress(self.done, self.total)

    def bar_class(self) -> type:
        from tqdm import tqdm

        transfer = self

        class Bar(tqdm):
            def __init__(self, *args, **kwargs):
                kwargs["disable"] = True  # a tqdm that is not huggingface_hub's own is never disabled for us
                super().__init__(*args, **kwargs)
                self.count = kwargs.get("initial") or 0
                transfer.bars.append(self)
                transfer.heard()

            def update(self, n=1):
                self.count += n or 0  # negative when a server ignored a Range and it starts over
                transfer.heard()

        return Bar


def _download(model: CatalogModel, say: Callable[[str], None], progress: Callable[[int, int], None] | None) -> None:
    # The transfer is huggingface_hub's public hf_hub_download: HF_ENDPOINT, retries that continue a
    # broken connection where it stopped, Xet storage, a copy already in its own cache reused. Into a
    # staging local_dir beside the final file rather than its cache: one copy, under MEMOSIGHT_CACHE,
    # with no link into a cache that `hf cache delete` empties; and the file takes its final name only
    # once our size and sha256 checks pass (local_dir=models_dir() would name it before them).
    from huggingface_hub import get_hf_file_metadata, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError

    path = model.path
    endpoint = hub_endpoint()
    url = model.url(endpoint)
    try:  # public repositories: no token, so none goes to an HF_ENDPOINT mirror or a CDN
        meta = get_hf_file_metadata(url, token=False, library_name="memosight", endpoint=endpoint)
    except HfHubHTTPError as exc:
        raise PullError(f"{endpoint} refused {model.file} of {model.repo} at {model.revision[:12]} "
                        f"({_first_line(exc)}); {by_hand(model)}") from exc
    except Exception as exc:
        if not _network_error(exc):
            raise
        raise PullError(f"cannot reach {endpoint} ({_first_line(exc)}); {by_hand(model)}") from exc
    if meta.size is not None and meta.size != model.size:
        raise PullError(f"{url} is {meta.size:,} bytes, but the catalog pins {model.size:,}: not downloading it")
    etag = (meta.etag or "").lower()
    if len(etag) == 64 and all(c in "0123456789abcdef" for c in etag) and etag != model.sha256:
        raise PullError(f"{url} has sha256 {etag}, but the catalog pins {model.sha256}: not downloading it")

    staging = models_dir() / f"{STAGING_PREFIX}{model.file}"
    shutil.rmtree(staging, ignore_errors=True)  # a killed pull's: hf_hub_download does not continue it
    path.with_name(path.name + PART_SUFFIX).unlink(missing_ok=True)  # an older memosight's, never continued now
    free = shutil.disk_usage(path.parent).free
    if free < model.size:
        raise PullError(f"{path.parent} has {free / 1e9:.1f} GB free; {model.name} needs {model.size / 1e9:.1f} GB")
    say(f"downloading {model.name} from {url} ({model.size / 1e6:,.0f} MB)")
    transfer = _Transfer(model.size, progress)
    try:
        try:
            got = Path(hf_hub_download(model.repo, model.file, revision=model.revision, local_dir=staging,
                                       endpoint=endpoint, token=False, library_name="memosight",
                                       tqdm_class=transfer.bar_class()))
        except KeyboardInterrupt:
            say(f"interrupted: nothing was kept; `memosight model pull {model.name}` downloads it again")
            raise
        except Exception as exc:  # HTTP errors, the network, a full disk, a size that did not add up
            if not (isinstance(exc, (HfHubHTTPError, OSError)) or _network_error(exc)):
                raise
            raise PullError(f"the download of {model.name} from {url} stopped at {transfer.done:,} of "
                            f"{model.size:,} bytes ({_first_line(exc)}); run `memosight model pull {model.name}` "
                            f"again, or {by_hand(model)}") from exc
        size = got.stat().st_size
        if size != model.size:
            raise PullError(f"{url} sent {size:,} bytes, not {model.size:,}; deleted what came. Run `memosight "
                            f"model pull {model.name}` again, or {by_hand(model)}")
        say(f"checking the sha256 of {model.file}")
        digest = sha256_of(got)
        if digest != model.sha256:
            raise PullError(f"the file downloaded from {url} has sha256 {digest}, not {model.sha256} as the "
                            f"catalog pins: deleted it, nothing was installed. Run `memosight model pull "
                            f"{model.name}` again, or {by_hand(model)}")
        os.replace(got, path)  # the same folder's child: whole or not at all
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _mark_verified(model, path)
