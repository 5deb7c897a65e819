"""General chat's per-speedup skip policies in the playground (model/chat_family.py: the family).

When a family is installed (``<adapters>/chat/skip-<S>x``) for the model the page runs, SkipDecode
at 1.5x, 2x or 3x runs the policy trained for that speedup only, loaded when first asked for and
kept in a small cache (as a task's policies are: app/tasks.py); at any other speedup, at 1x and
with the skip policy switched off, the general model and its shared policy run as before. The
status line says which policy ran.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from app.serving.loaded_generators import LoadedGenerators
from model import chat_family
from model.generation.generator import TextGenerator
from model.loading import DEFAULT_MODEL, LoadedModel, load_model, with_cuda_graphs

log = logging.getLogger(__name__)
# (policy folder, the general generator) -> the policy on the same model, weights and device
ChatLoader = Callable[[Path, TextGenerator], LoadedModel]


def load_beside(policy: Path, general: TextGenerator) -> LoadedModel:
    """``policy`` on the model ``general`` runs, in its weight mode and on its device."""
    loaded = general.loaded
    name = None if loaded.name == DEFAULT_MODEL else loaded.name
    return with_cuda_graphs(load_model(name, device=str(loaded.device), adapter=str(policy), quantize=loaded.quantize))


class ChatPolicies:
    """The chat family's generators, one per policy, loaded on first use (``size`` kept, least
    recently used dropped). ``root`` None reads model.chat_family.ADAPTERS when asked
    ($SKIPDECODE_TASK_ADAPTERS at import); ``loader`` replaces load_beside (tests: tiny models)."""

    def __init__(self, root: Path | None = None, loader: ChatLoader | None = None, size: int = 2) -> None:
        self.root, self.loader = root, loader or load_beside
        self.loaded = LoadedGenerators(size)  # by policy folder

    def folder(self) -> Path:
        return chat_family.family_folder(self.root)

    def policy(self, speedup: float, general: TextGenerator) -> Path | None:
        """The family's policy for ``speedup`` when one is installed for ``general``'s model and
        ``general`` runs a skip policy at all (SKIPDECODE_ADAPTER=none switches the family off too)."""
        if speedup <= 1 or not general.loaded.adapter_path:
            return None
        policy = chat_family.family_policy(self.folder(), speedup)
        if policy is None or (chat_family.trained_on(policy) or DEFAULT_MODEL) != general.loaded.name:
            return None
        return policy

    def generator(self, speedup: float, general: TextGenerator, load: bool = True) -> TextGenerator:
        """The generator SkipDecode runs at ``speedup``: the family's policy (loaded now unless
        ``load`` is False: then ``general``, which tokenizes and counts layers the same way, sizes
        the job) or ``general`` with the shared policy. A policy that fails to load is logged and
        the shared one runs."""
        policy = self.policy(speedup, general)
        if policy is None:
            return general
        if not load:
            return self.loaded.get(str(policy)) or general
        try:
            return self.loaded.get_or_load(str(policy), lambda: TextGenerator(self.loader(policy, general)))
        except (OSError, ValueError) as error:
            log.warning("chat policy %s does not load, the shared policy runs: %s", policy, error)
            return general

    def line(self, speedup: float, skip_policy: bool, ran: TextGenerator, general: TextGenerator) -> str:
        """Which policy SkipDecode runs, for the status line ("" when no family is installed)."""
        if not chat_family.family_policies(self.folder()) or not general.loaded.adapter_path:
            return ""
        if speedup <= 1 or not skip_policy:
            return ""
        if ran is not general:
            return (f"General chat: SkipDecode runs at {speedup:g}x with {Path(ran.loaded.adapter_path or '').name}, "
                    "the skip policy trained for this speedup only; the full pane is the general model.")
        return (f"General chat: SkipDecode runs at {speedup:g}x with the shared skip policy (the per-speedup "
                "policies are trained for " + ", ".join(f"{s:g}x" for s in chat_family.family_policies(self.folder()))
                + "); the full pane is the general model.")
