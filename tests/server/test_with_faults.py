import pytest

from memosight.server import with_faults
from memosight.server.__main__ import parse_args


def test_a_bad_fault_plan_is_refused_with_the_reason(capsys):
    with pytest.raises(SystemExit) as exited:
        with_faults.main(["--faults", "explode=2", "--stdio"])
    assert exited.value.code == 2 and "--faults" in capsys.readouterr().err


def test_the_shipped_server_knows_nothing_of_faults():
    with pytest.raises(SystemExit):
        parse_args(["--inject-faults", "raise=0.1"])
