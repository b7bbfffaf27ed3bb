import os

from memosight.server.commands.common import process_memory_mb


def test_process_memory_reads_this_process_and_nothing_for_one_that_is_gone():
    now, peak = process_memory_mb(os.getpid()), process_memory_mb(os.getpid(), "VmHWM")
    assert 0 < now <= peak
    assert process_memory_mb(2**22 + 12345) is None
