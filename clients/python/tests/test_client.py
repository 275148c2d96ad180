"""The Python client against a real daemon: every endpoint, errors, events, retries."""

import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import compactd  # noqa: E402
from daemon import Daemon  # noqa: E402


def bash_round(i: int, output: str):
    return [
        {"role": "assistant", "parts": [
            {"type": "text", "text": f"Step {i}."},
            {"type": "tool_call", "id": f"c{i}", "name": "bash", "args": {"command": f"cat m{i}.py"}}]},
        {"role": "tool", "parts": [{"type": "tool_result", "call_id": f"c{i}", "output": output}]},
    ]


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon("[compaction]\nmax_messages = 8\n")
        self.client = compactd.Client(self.daemon.socket)

    def tearDown(self):
        self.daemon.close()

    def test_sessions_messages_context_and_compaction(self):
        c = self.client
        created = c.create_session("py", context_limit=32000, model="m")
        self.assertEqual((created["id"], created["context_limit"]), ("py", 32000))
        first = c.append("py", {"role": "user", "content": "Fix the parser"})
        self.assertEqual((first["first_seq"], first["last_seq"]), (1, 1))
        statuses = []
        for i in range(5):
            answer = c.append("py", bash_round(i, "x" * 400), wait=True)
            if answer["compaction"]:
                statuses.append(answer["compaction"]["status"])
        self.assertEqual(statuses, ["completed"])
        self.assertEqual(c.session("py")["compaction_count"], 1)
        self.assertEqual([s["id"] for s in c.sessions()], ["py"])

        ctx = c.context("py")
        self.assertEqual(ctx["compaction_num"], 1)
        self.assertTrue(any(m.get("summary") for m in ctx["messages"]))
        openai = c.context("py", format="openai")
        roles = [m["role"] for m in openai["messages"]]
        self.assertEqual(roles[0], "user")
        self.assertIn("tool", roles)
        anthropic = c.context("py", format="anthropic")
        self.assertEqual(anthropic["messages"][0]["role"], "user")

        page = c.messages("py", limit=2)
        self.assertEqual([m["seq"] for m in page["messages"]], [1, 2])
        self.assertEqual(page["next_after"], 2)
        history = c.compactions("py")
        self.assertEqual(history["compactions"][0]["compaction_num"], 1)
        self.assertIn("## 9. Optional Next Step", history["compactions"][0]["summary"])
        manual = c.summarize("py", focus="the parser")
        self.assertIn("compacted", manual)
        # The usage of a call sent with the context before that compaction is not counted.
        late = c.append("py", {"role": "assistant", "content": "ok"}, input_tokens=9000,
                        compaction_num=ctx["compaction_num"])
        self.assertEqual(late["token_source"], "estimated" if manual["compacted"] else "reported")
        now = c.append("py", {"role": "assistant", "content": "ok"}, input_tokens=9000,
                       compaction_num=c.context("py")["compaction_num"])
        # 9,000 and the answer ("ok", one token) at the report's rate (at most 4 a token).
        self.assertEqual(now["token_source"], "reported")
        self.assertTrue(9001 <= now["tokens"] <= 9004, now)
        self.assertTrue(1 <= c.session("py")["report_rate"] <= 4)

        # The model refused the context as too long: passed on, the window it named is the
        # session's limit and what it counted the session's tokens.
        refusal = {"type": "error", "error": {"type": "invalid_request_error",
                   "message": "prompt is too long: 30000 tokens > 20000 maximum"}}
        told = c.overflow("py", refusal, compaction_num=c.context("py")["compaction_num"])
        self.assertEqual((told["noted"], told["tokens"], told["context_limit"]), (True, 30000, 20000))
        self.assertEqual(c.session("py")["context_limit"], 20000)
        self.assertLessEqual(c.context("py")["tokens"], 20000)
        with self.assertRaises(compactd.CompactdError) as refused:
            c.overflow("py", {"error": {"type": "rate_limit_error", "message": "slow down"}})
        self.assertEqual((refused.exception.status, refused.exception.code), (400, "bad_request"))

        updated = c.update_session("py", model="m2")
        self.assertEqual(updated["model"], "m2")
        self.assertEqual(c.delete_session("py")["deleted"], True)

    def test_errors_are_typed(self):
        c = self.client
        with self.assertRaises(compactd.CompactdError) as e:
            c.session("ghost")
        self.assertEqual((e.exception.status, e.exception.code), (404, "not_found"))
        with self.assertRaises(compactd.CompactdError) as e:
            c.append("py", {"role": "tool", "parts": [
                {"type": "tool_result", "call_id": "nope", "output": ""}]})
        self.assertEqual(e.exception.code, "unknown_call")
        gone = compactd.Client(os.path.join(self.daemon.dir.name, "nobody.sock"))
        with self.assertRaises(compactd.NotRunning):
            gone.health()

    def test_events_arrive_in_order(self):
        c = self.client
        events = c.events(timeout=30)
        c.append("ev", [{"role": "user", "content": "go"}] + bash_round(0, "y" * 100)
                 + bash_round(1, "y") + bash_round(2, "y") + bash_round(3, "y"), wait=True)
        kinds = []
        for event in events:
            kinds.append(event["event"])
            if event["event"] == "compaction_finished":
                self.assertEqual(event["session_id"], "ev")
                break
        events.close()
        self.assertEqual(kinds, ["compaction_started", "compaction_finished"])

    def test_an_append_during_a_restart_lands_once(self):
        c = self.client
        c.append("r", {"role": "user", "content": "before"})
        self.daemon.process.kill()
        self.daemon.process.wait()
        result = {}
        worker = threading.Thread(
            target=lambda: result.update(c.append("r", {"role": "user", "content": "during"})))
        worker.start()
        self.daemon.start()
        worker.join(timeout=30)
        self.assertEqual(result.get("last_seq"), 2)
        texts = [m["parts"][0]["text"] for m in c.messages("r")["messages"]]
        self.assertEqual(texts, ["before", "during"])


if __name__ == "__main__":
    unittest.main()
