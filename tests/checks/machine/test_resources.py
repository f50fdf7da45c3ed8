from __future__ import annotations

from checks.machine import resources as res
from checks.result import Status
from tests.factories import GIB, config, gpu, machine

MIB = 1024**2


def _one(check, **host):
    [r] = check(machine(host=host), config())
    return r


def test_cgroup_quota_beats_the_host_cpu_count() -> None:
    r = _one(res.cpu_cores, cpu_logical=64, cpu_affinity=64, cgroup_cpu_quota=3.0)
    assert r.status is Status.WARN and r.value == 3.0 and "cgroup quota 3" in r.summary


def test_affinity_beats_the_host_cpu_count() -> None:
    r = _one(res.cpu_cores, cpu_logical=64, cpu_affinity=1)
    assert r.status is Status.FAIL and "affinity 1 of 64" in r.summary


def test_cores_are_shared_between_gpus() -> None:
    m = machine(gpus=tuple(gpu(i) for i in range(8)), host={"cpu_logical": 24, "cpu_affinity": 24})
    [r] = res.cpu_cores(m, config())
    assert r.value == 3.0 and r.status is Status.WARN


def test_ram_uses_the_container_limit() -> None:
    r = _one(res.ram, mem_total=512 * GIB, cgroup_mem_limit=32 * GIB)
    assert r.status is Status.WARN and "container limit" in r.summary


def test_shm_warns_when_workers_do_not_fit_and_fails_below_the_floor() -> None:
    assert _one(res.shm, shm_total=1024 * MIB).status is Status.WARN  # 16 workers x 256 MiB wanted
    assert _one(res.shm, shm_total=64 * MIB).status is Status.FAIL
    assert _one(res.shm, shm_total=None).status is Status.FAIL


def test_loader_advice_follows_cores_and_shm() -> None:
    advice = res.loader_advice(machine(host={"cpu_affinity": 9, "shm_total": 64 * GIB}), config())
    assert advice.as_dict() == {"num_workers": 8, "pin_memory": True, "persistent_workers": True, "prefetch_factor": 2}
    shm_bound = res.loader_advice(machine(host={"cpu_affinity": 9, "shm_total": 1024 * MIB}), config())
    assert shm_bound.num_workers == 4 and any("/dev/shm" in r for r in shm_bound.reasons)
    capped = res.loader_advice(machine(host={"cpu_logical": 128, "cpu_affinity": 128}), config())
    assert capped.num_workers == 16


def test_no_spare_core_means_zero_workers_and_a_warning() -> None:
    r = _one(res.dataloader_advice, cpu_affinity=1)
    assert r.status is Status.WARN and r.value["num_workers"] == 0 and r.value["prefetch_factor"] is None


def test_advice_tells_a_staged_folder_from_data_decoded_as_it_is_read() -> None:
    r = _one(res.dataloader_advice, cpu_affinity=9)
    assert r.value["num_workers"] == 8 and "decoded as it is read" in r.summary
    assert "stage-data folder needs no workers: staged_loader" in r.summary
    assert "staged_loader" in (_one(res.dataloader_advice, cpu_affinity=1).hint or "")


def test_ulimit_hints_depend_on_the_hard_limit() -> None:
    r = _one(res.ulimits, nofile_soft=1024, nofile_hard=1048576)
    assert r.status is Status.WARN and "ulimit -n 1048576" in (r.hint or "")
    r = _one(res.ulimits, nofile_soft=20000, nofile_hard=20000)
    assert "raise it as root" in (r.hint or "")


def test_memlock_only_matters_with_several_gpus() -> None:
    assert _one(res.ulimits, memlock_soft=64 * 1024).status is Status.OK
    m = machine(gpus=(gpu(0), gpu(1)), host={"memlock_soft": 64 * 1024})
    [r] = res.ulimits(m, config())
    assert r.status is Status.WARN and "locked memory" in r.summary


def test_powersave_under_acpi_cpufreq_warns_with_the_count() -> None:
    r = _one(res.cpu_governor, cpu_freq_driver="acpi-cpufreq", cpu_governors={"powersave": 6, "performance": 2})
    assert r.status is Status.WARN and "6 of 8 CPUs on the powersave governor (acpi-cpufreq)" in r.summary
    assert "frequency-set -g performance" in (r.hint or "") and "estimate" in (r.hint or "")


def test_powersave_of_a_dynamic_pstate_driver_passes() -> None:
    r = _one(res.cpu_governor, cpu_freq_driver="intel_pstate", cpu_governors={"powersave": 8})
    assert r.status is Status.OK and "8 powersave" in r.summary and "scales with load" in r.summary
    # intel_pstate in passive mode is "intel_cpufreq": there powersave is the generic one, the lowest clock
    r = _one(res.cpu_governor, cpu_freq_driver="intel_cpufreq", cpu_governors={"powersave": 8})
    assert r.status is Status.WARN


def test_no_cpufreq_is_ok_and_says_the_host_sets_the_clocks() -> None:
    r = _one(res.cpu_governor)
    assert r.status is Status.OK and "cpufreq not exposed" in r.summary
    assert _one(res.cpu_governor, cpu_freq_driver="acpi-cpufreq", cpu_governors={"performance": 4}).status is Status.OK
