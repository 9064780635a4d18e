"""bench load's judgement of one page's events: a hang, a second done, a gap in the
deltas or text that differs from the stored reply are each a problem."""

from bench.load import check_stream


def events(*deltas: str, dones: int = 1, status: str = "done") -> list[dict]:
    out = [{"type": "message.delta", "message_id": 7, "seq": i + 1, "text": t}
           for i, t in enumerate(deltas)]
    done = {"type": "message.done", "message_id": 7, "seq": len(deltas) + 1,
            "message": {"content": "".join(deltas), "status": status}}
    return out + [done] * dones


def test_a_whole_stream_is_no_problem():
    assert check_stream(events("Se", "ven."), 7) == ""


def test_each_way_a_reply_can_go_wrong_is_named():
    assert check_stream(events("Se", "ven.", dones=0), 7) == "hang"
    assert check_stream(events("Se", "ven.", dones=2), 7) == "duplicate done"
    assert check_stream(events("Se", "ven.", status="stopped"), 7) == "ended stopped"
    gap = events("Se", "ven.")
    del gap[0]
    assert check_stream(gap, 7).startswith("deltas out of sequence: [2] then done 3")
    wrong = events("Se", "ven.")
    wrong[-1]["message"]["content"] = "Eight."
    assert check_stream(wrong, 7).startswith("deltas differ from the stored text")
    assert check_stream([], None) == "no reply was created"
