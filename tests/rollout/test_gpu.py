"""Reading nvidia-smi: real output shapes, pure."""

from ddops.rollout.switch.gpu import judge_output, parse_compute_apps

BUSY = "12345, python3, 40112\n23456, /usr/bin/sglang::scheduler, 512\n"


def test_processes_are_parsed_with_memory():
    procs = parse_compute_apps(BUSY)
    assert [(p.pid, p.name, p.used_mib) for p in procs] == \
        [(12345, "python3", 40112), (23456, "/usr/bin/sglang::scheduler", 512)]


def test_busy_gpu_blocks_the_start_and_names_the_holders():
    check = judge_output(0, BUSY, "")
    assert check.status == "busy" and not check.may_start
    assert "pid 12345 python3 (40112 MiB)" in check.detail


def test_free_and_absent_allow_the_start():
    assert judge_output(0, "", "").status == "free"
    absent = judge_output(0, "NO-NVIDIA-SMI\n", "")
    assert absent.status == "absent" and absent.may_start and "no nvidia-smi" in absent.detail


def test_nvidia_smi_failure_is_not_taken_as_free():
    check = judge_output(9, "", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    assert check.status == "error" and not check.may_start and "couldn't communicate" in check.detail


def test_free_memory_is_the_smallest_over_cards():
    from ddops.rollout.switch.gpu import parse_free_mib
    assert parse_free_mib("48012\n1203\n") == 1203
    assert parse_free_mib("NO-NVIDIA-SMI\n") is None
    assert parse_free_mib("") is None
