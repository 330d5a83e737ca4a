"""`--model ORG/NAME`: a Hugging Face hub id resolved to the user's local hub cache, offline, never a download.

Where the cache is, as huggingface_hub decides it: $HF_HUB_CACHE, else $HF_HOME/hub, else
~/.cache/huggingface/hub. A model is `models--ORG--NAME/snapshots/<revision>/` there; `refs/main` names the
revision (a cache with no refs/main and one snapshot uses that one). Nothing is fetched and nothing is
written: a model that is not there is a ModelNotFoundError saying where headcount looked.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# ORG/NAME as the hub spells repository ids (letters, digits, '-', '_', '.'), one slash
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


class HubModelNotFound(ValueError):
    """A hub id that is not in the local cache (the message says where headcount looked)."""


def is_hub_id(name: str) -> bool:
    return bool(HUB_ID.match(name)) and ".." not in name


def hub_cache() -> Path:
    """The hub cache directory huggingface_hub uses: $HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def snapshot_dir(repo_id: str) -> Path:
    """The local snapshot directory of hub model `repo_id` (ORG/NAME), or HubModelNotFound naming where it
    looked. Reads only: refs/main, then the snapshot it names."""
    if not is_hub_id(repo_id):
        raise HubModelNotFound(f"{repo_id!r} is not a hub id (expected ORG/NAME)")
    org, name = repo_id.split("/")
    root = hub_cache() / f"models--{org}--{name}"
    snapshots = root / "snapshots"
    if not snapshots.is_dir():
        raise HubModelNotFound(f"hub model {repo_id!r} is not in the local cache: looked for {snapshots} "
                               "(set HF_HUB_CACHE or HF_HOME if the cache is elsewhere; headcount never downloads)")
    ref = root / "refs" / "main"
    if ref.is_file():
        revision = ref.read_text().strip()
        chosen = snapshots / revision
        if not chosen.is_dir():
            raise HubModelNotFound(f"hub model {repo_id!r}: {ref} names revision {revision!r}, but {chosen} is missing")
        return chosen
    found = sorted(p for p in snapshots.iterdir() if p.is_dir())
    if len(found) == 1:
        return found[0]
    raise HubModelNotFound(f"hub model {repo_id!r}: {ref} is missing and {snapshots} holds "
                           f"{len(found)} snapshots ({', '.join(p.name[:12] for p in found[:4]) or 'none'}); "
                           "give the snapshot directory's path instead")
