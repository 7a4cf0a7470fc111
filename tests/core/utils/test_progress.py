"""``deepspeed.utils.progress``: tqdm bars on a terminal, nothing in logs and pipes."""
import io

from deepspeed.utils.progress import progress, progress_write


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_bar_is_drawn_on_a_terminal_and_nothing_elsewhere():
    for stream, drawn in ((Terminal(), True), (io.StringIO(), False)):
        assert list(progress(range(3), desc="work", file=stream)) == [0, 1, 2]
        assert ("work: 100%" in stream.getvalue() and "3/3" in stream.getvalue()) == drawn
        assert drawn or stream.getvalue() == ""


def test_a_disabled_bar_draws_nothing_even_on_a_terminal():
    stream = Terminal()
    with progress(total=4, desc="work", enabled=False, file=stream) as bar:
        bar.update(4)
    assert stream.getvalue() == ""


def test_messages_go_to_stdout_with_or_without_a_bar(capsys):
    with progress(total=2, desc="work", file=Terminal()) as bar:
        progress_write("one line", bar)
    progress_write("another", None)
    assert capsys.readouterr().out.splitlines() == ["one line", "another"]
