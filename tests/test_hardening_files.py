"""The file-system boundary over every command (moe_hydra.testing.files): each path a command is given, given as
what it is not — nonexistent, a directory for a file, a file for a directory, binary, Latin-1, truncated, empty, a
ledger without its fields — ends in one message naming the path, exit 1 or 2, never a traceback.
``benchmarks/hardening_files.py`` runs the same cases and prints the counts."""

from __future__ import annotations

import pytest

from moe_hydra.commands import COMMANDS
from moe_hydra.testing import files

CASES = files.cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_bad_path_is_refused_naming_it(tmp_path, case):
    if case.kind == files.UNREADABLE and not files.permissions_apply():
        pytest.skip("root reads a file of mode 000: unreadable paths are checked as another user")
    outcome = files.check(case, tmp_path)
    assert outcome.broken is None, f"{outcome.broken} (exit {outcome.code}):\n{outcome.said[-3000:]}"


def test_every_command_that_takes_a_path_has_cases():
    """A command that reads a file or a directory the user names is in the table (run: its run directory and
    MOE_HYDRA_SITE); a new command must say what it reads."""
    covered = {c.command for c in CASES}
    assert covered == set(COMMANDS), set(COMMANDS) ^ covered
    kinds = {c.kind for c in CASES}
    assert {files.NONEXISTENT, files.DIRECTORY, files.FILE, files.BINARY, files.LATIN1, files.TRUNCATED} <= kinds
