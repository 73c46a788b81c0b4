from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmrt import HostlistError, hostlist

# Expected values read off `scontrol show hostnames` on Slurm 22.05 (docs/slurm.md and this module's docstring).
TABLE = [
    ("n[001-003,7]", ["n001", "n002", "n003", "n7"]),
    ("n[9-11]", ["n9", "n10", "n11"]),
    ("n[01-10]", ["n01", "n02", "n03", "n04", "n05", "n06", "n07", "n08", "n09", "n10"]),
    ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
    ("n[1-3],m[5-6]", ["n1", "n2", "n3", "m5", "m6"]),
    ("node1,,node2", ["node1", "node2"]),
    ("n[1-2]-[3-4]-[5-6]", ["n1-3-5", "n1-3-6", "n2-3-5", "n2-3-6", "n1-4-5", "n1-4-6", "n2-4-5", "n2-4-6"]),
    ("1.2.3.[089,100-102]", ["1.2.3.089", "1.2.3.100", "1.2.3.101", "1.2.3.102"]),
    ("[1-2]", ["1", "2"]),
    ("n[1-2][3-4]", ["n13", "n14", "n23", "n24"]),
    ("n[01-1]", ["n01"]),
    ("n[1-02]", ["n1", "n2"]),
    ("n[1,1]", ["n1", "n1"]),
    ("n1 n2\tn3", ["n1", "n2", "n3"]),
    ("localhost", ["localhost"]),
    ("", []),
]

INVALID = ["n[3-1]", "n[a-b]", "n[1-3]x", "gpu-[1-2]-ib", "n[1-2", "n[]", "n[1,,2]", "n[1-2-3]", "n[-2]",
           "n[1-65537]", "n[1-2]]", "n1]", "n[[1]]"]


@pytest.mark.parametrize(("expr", "hosts"), TABLE)
def test_expand_matches_scontrol_table(expr: str, hosts: list[str]) -> None:
    assert hostlist.expand(expr) == hosts


@pytest.mark.parametrize("expr", INVALID)
def test_expand_rejects_what_scontrol_rejects_naming_the_part(expr: str) -> None:
    with pytest.raises(HostlistError, match="invalid hostlist") as info:
        hostlist.expand(expr)
    assert repr(expr) in str(info.value)


@pytest.mark.parametrize(("hosts", "expr"), [
    (["n3", "n1", "n2"], "n[3,1-2]"),
    (["n09", "n10"], "n[09-10]"),
    (["n9", "n10"], "n[9-10]"),
    (["a1b3", "a1b4", "a2b3"], "a1b[3-4],a2b3"),
    (["n1", "n01", "n2"], "n[1,01,2]"),
    (["x", "n1"], "x,n1"),
    (["n1", "m1", "n2"], "n1,m1,n2"),
    (["n009", "n010", "n011"], "n[009-011]"),
    (["n8", "n9", "n10"], "n[8-10]"),
    (["gpu098", "gpu099", "gpu100", "gpu101"], "gpu[098-101]"),
])
def test_compress_matches_scontrol_show_hostlist(hosts: list[str], expr: str) -> None:
    assert hostlist.compress(hosts) == expr


def test_compress_rejects_names_it_cannot_represent() -> None:
    with pytest.raises(HostlistError, match="cannot compress"):
        hostlist.compress(["n[1]"])


_names = st.from_regex(r"[a-z]{1,3}(-?[0-9]{1,4})?", fullmatch=True)


@given(st.lists(_names, max_size=40))
def test_expand_inverts_compress_exactly(hosts: list[str]) -> None:
    assert hostlist.expand(hostlist.compress(hosts)) == hosts


@pytest.mark.parametrize("expr", ["n[\u0661-\u0662]", "n[1_0]", "n[\u0663]", "n[1-\u0662]"])
def test_expand_accepts_ascii_digits_only(expr: str) -> None:
    with pytest.raises(HostlistError, match="decimal numbers"):
        hostlist.expand(expr)


