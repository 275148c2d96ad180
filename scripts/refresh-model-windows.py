#!/usr/bin/env python3
"""Refreshes src/provider/model_windows.json: each chat model's context window, by name.

The source is LiteLLM's model table (model_prices_and_context_window.json, MIT licensed, see
src/provider/model_windows.LICENSE), from a LiteLLM installed with pip or downloaded:

    python3 -m pip download --no-deps litellm && unzip -p litellm-*.whl \
        litellm/model_prices_and_context_window_backup.json > models.json
    python3 scripts/refresh-model-windows.py models.json

Only chat and responses models with an input window are kept; a provider prefix is kept as
LiteLLM names it (compactd also tries the name without it).
"""
import json
import sys

source = json.load(open(sys.argv[1]))
windows = {}
for name, entry in source.items():
    if not isinstance(entry, dict) or entry.get("mode") not in ("chat", "responses"):
        continue
    window = entry.get("max_input_tokens") or entry.get("max_tokens")
    if isinstance(window, int) and window > 0:
        windows[name] = window
out = "src/provider/model_windows.json"
with open(out, "w") as f:
    json.dump(dict(sorted(windows.items())), f, indent=0, separators=(",", ":"))
    f.write("\n")
print(f"{out}: {len(windows)} models")
