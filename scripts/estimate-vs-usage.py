#!/usr/bin/env python3
"""compactd's token estimate (src/compaction/estimate.rs) against what the models counted.

The shared transcripts record the model's own usage for each call: Claude Code's assistant
records (input_tokens + cache_creation_input_tokens + cache_read_input_tokens) and
mini-swe-agent's (extra.response.usage.prompt_tokens). For each transcript this prints how
many tokens the model counted per token compactd estimates for the same text: over the whole
prompt (mini-swe-agent sends its whole conversation; Claude Code's system prompt and tools are
not in its transcript, so for it only the growth between calls is compared), and for the
single steps that added the most (a large tool output at once).

    python3 scripts/estimate-vs-usage.py [../shared/transcripts]
"""

import glob
import json
import os
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../shared/transcripts")


def estimated_chars(text):
    """Characters as compactd's estimate counts them (src/compaction/estimate.rs): ASCII one
    each but a digit two, two more where a digit follows a letter or a letter a digit, two
    more where a letter or digit follows ASCII punctuation, four more where a capital follows a
    small letter; an accented Latin or a Cyrillic letter two, any other character four."""
    counted, last = 0, None
    for c in text:
        code = ord(c)
        if c in "0123456789":
            kind = "digit"
        elif code < 0x80 and c.isalpha():
            kind = "small" if c.islower() else "capital"
        elif code < 0x80 and 0x21 <= code <= 0x7E:
            kind = "punctuation"
        else:
            kind = None
        if kind == "digit":
            counted += 2
        elif code < 0x80:
            counted += 1
        elif code <= 0x24F or 0x300 <= code <= 0x36F or 0x400 <= code <= 0x52F:
            counted += 2
        else:
            counted += 4
        letters = ("small", "capital")
        if (kind == "digit" and last in letters) or (kind in letters and last == "digit"):
            counted += 2
        if kind in ("digit", "small", "capital") and last == "punctuation":
            counted += 2
        if kind == "capital" and last == "small":
            counted += 4
        last = kind
    return counted


def block_chars(block):
    kind = block.get("type")
    if kind == "text":
        return estimated_chars(block["text"])
    if kind == "thinking":
        return estimated_chars(block.get("thinking", ""))
    if kind == "tool_use":
        return estimated_chars(block["name"]) + estimated_chars(json.dumps(block["input"], ensure_ascii=False))
    if kind == "tool_result":
        content = block.get("content")
        if isinstance(content, str):
            return estimated_chars(content)
        if isinstance(content, list):
            return sum(estimated_chars(c.get("text", "")) for c in content if c.get("type") == "text")
    return 0


def claude_code(path):
    """(estimated chars before each call, tokens the model counted) per API call."""
    chars, calls, seen = 0, [], set()
    for line in open(path):
        record = json.loads(line)
        if record.get("type") not in ("user", "assistant") or record.get("isSidechain"):
            continue
        message = record["message"]
        if record["type"] == "assistant":
            usage = message.get("usage")
            if usage and message["id"] not in seen:
                seen.add(message["id"])
                counted = sum(usage.get(k, 0) for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
                calls.append((chars, counted))
        content = message["content"]
        chars += estimated_chars(content) if isinstance(content, str) else sum(block_chars(b) for b in content)
    return calls


def mini_swe_agent(path):
    chars, calls = 0, []
    for message in json.load(open(path))["messages"]:
        if message["role"] == "assistant":
            usage = ((message.get("extra") or {}).get("response") or {}).get("usage")
            if usage:
                calls.append((chars, usage["prompt_tokens"]))
        content = message["content"]
        chars += estimated_chars(content) if isinstance(content, str) else sum(estimated_chars(c.get("text", "")) for c in content)
    return calls


def growth(calls):
    """Counted over estimated tokens, summed over the calls whose prompt grew, and per step of
    more than 2,000 estimated tokens."""
    pairs = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(calls, calls[1:]) if b[1] > a[1]]
    estimated = sum(chars for chars, _ in pairs) / 4
    counted = sum(tokens for _, tokens in pairs)
    big = [tokens / (chars / 4) for chars, tokens in pairs if chars / 4 > 2000]
    return (counted / estimated if estimated else 0), big


print(f"{'transcript':48} {'calls':>5} {'whole':>6} {'growth':>6} {'big steps (min-max)':>20}")
steps = []
for path in sorted(glob.glob(os.path.join(ROOT, "claude-code/*.jsonl"))):
    calls = claude_code(path)
    ratio, big = growth(calls)
    steps += big
    spread = f"{min(big):.2f}-{max(big):.2f} ({len(big)})" if big else "-"
    print(f"{'claude-code/' + os.path.basename(path)[:36]:48} {len(calls):5} {'-':>6} {ratio:6.2f} {spread:>20}")
for path in sorted(glob.glob(os.path.join(ROOT, "mini-swe-agent/*.json"))):
    calls = mini_swe_agent(path)
    ratio, big = growth(calls)
    steps += big
    chars, tokens = calls[-1]
    spread = f"{min(big):.2f}-{max(big):.2f} ({len(big)})" if big else "-"
    print(f"{'mini-swe-agent/' + os.path.basename(path)[:33]:48} {len(calls):5} {tokens / (chars / 4):6.2f} {ratio:6.2f} {spread:>20}")
steps.sort()
if steps:
    print(f"steps over 2,000 estimated tokens: {len(steps)}, counted/estimated p50 {steps[len(steps) // 2]:.2f}, "
          f"p90 {steps[int(len(steps) * 0.9)]:.2f}, max {steps[-1]:.2f}")
