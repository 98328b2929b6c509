"""The console and JSON-lines file channels."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading

import pytest
from changewatch.channels import ConsoleChannel, DeliveryError, FileChannel


def test_console_prints_a_compact_block(notification_factory) -> None:
    out = io.StringIO()
    ConsoleChannel("out", stream=out).send(notification_factory())
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[0] == "! [high] Issue #42 closed: crash on start"
    assert "closed_bugs | demo_issues update 42 | 2024-05-02T06:30:00+00:00" in lines[1]
    # The watch's rendered body, not the automatic summary.
    assert "    state: open -> closed" in lines
    assert "The crash on start was fixed" not in text
    assert "    https://tracker.example/issues/42" in lines
    assert text.endswith("\n\n")


def test_console_defaults_to_stdout_and_strips_terminal_escapes(
    notification_factory, capsys: pytest.CaptureFixture[str]
) -> None:
    ConsoleChannel("out").send(
        notification_factory(title="\x1b[2J\x1b[31mred\x07 title", summary=None, url=None)
    )
    printed = capsys.readouterr().out
    assert "\x1b" not in printed and "\x07" not in printed
    assert "[2J[31mred title" in printed
    assert "state: open -> closed" in printed


def test_console_shows_the_summary_only_for_a_blank_body(notification_factory) -> None:
    out = io.StringIO()
    ConsoleChannel("out", stream=out).send(notification_factory(body="  "))
    assert "    The crash on start was fixed and the issue closed." in out.getvalue()


def test_file_appends_one_json_line_per_notification(notification_factory, tmp_path) -> None:
    path = tmp_path / "deep" / "er" / "notifications.jsonl"
    channel = FileChannel("log", path)
    first = notification_factory()
    second = notification_factory(notification_id="ntf_2", title="Issue #43\nopened")
    channel.send(first)
    channel.send(second)
    lines = path.read_bytes().splitlines()
    assert [json.loads(line) for line in lines] == [first.to_json(), second.to_json()]


def test_file_concurrent_appends_never_interleave(notification_factory, tmp_path) -> None:
    path = tmp_path / "n.jsonl"
    # Two channels on the same file, as two watches routed to one file would be.
    channels = [FileChannel("a", path), FileChannel("b", path)]
    big = "x" * 20_000

    def worker(i: int) -> None:
        for j in range(40):
            channels[i % 2].send(notification_factory(notification_id=f"n{i}_{j}", body=big))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [json.loads(line)["notification_id"] for line in path.read_text().splitlines()]
    assert sorted(ids) == sorted(f"n{i}_{j}" for i in range(8) for j in range(40))


def test_file_into_a_directory_is_a_permanent_error(notification_factory, tmp_path) -> None:
    with pytest.raises(DeliveryError) as info:
        FileChannel("log", tmp_path).send(notification_factory())
    assert info.value.retryable is False


def test_file_batch_is_one_write_of_every_line(notification_factory, tmp_path) -> None:
    path = tmp_path / "n.jsonl"
    batch = [notification_factory(notification_id=f"ntf_{i}", title=f"#{i}") for i in range(50)]
    assert FileChannel("log", path).send_batch(batch) == [None] * 50
    assert [json.loads(line) for line in path.read_bytes().splitlines()] == [
        n.to_json() for n in batch
    ]


# A file-size limit makes the kernel write part of the batch and refuse the rest (EFBIG), as
# a disk filling up part-way would. Its own process: the limit would bind pytest too.
_PARTIAL_WRITE = """
import json, resource, signal, sys
from datetime import UTC, datetime
from changewatch.channels import FileChannel, Notification
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
batch = [
    Notification(notification_id=f"ntf_{i}", watch="w", source="s", object_key=str(i),
                 kind="insert", title="x" * 100, body="", url=None, urgency="normal",
                 summary=None, created_at=datetime(2026, 1, 1, tzinfo=UTC))
    for i in range(3)
]
line = len(batch[0].to_json_bytes()) + 1
resource.setrlimit(resource.RLIMIT_FSIZE, (2 * line + line // 2, resource.RLIM_INFINITY))
outcomes = FileChannel("log", sys.argv[1]).send_batch(batch)
print(json.dumps([o if o is None else [str(o), o.retryable] for o in outcomes]))
"""


def test_file_batch_cut_short_counts_the_whole_lines_written(tmp_path) -> None:
    path = tmp_path / "n.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", _PARTIAL_WRITE, str(path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    first, second, third = json.loads(done.stdout)
    # Two whole lines arrived: delivered. The torn third failed and may be retried.
    assert (first, second) == (None, None)
    assert "cannot append" in third[0] and third[1] is True
    lines = path.read_bytes().split(b"\n")
    assert [json.loads(line)["notification_id"] for line in lines[:2]] == ["ntf_0", "ntf_1"]
