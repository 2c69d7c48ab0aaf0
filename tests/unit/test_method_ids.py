"""Method ids are kebab-case, each method is listed once, and the old snake_case ids
(``mh_pfedhn``) still name the same methods."""

from __future__ import annotations

import re

import pytest

from server_toolkit.methods import ALIASES, canonical_name, method_class, methods


def test_every_method_id_is_kebab_case_and_listed_once():
    listed = methods()
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name) for name in listed), sorted(listed)
    assert len(set(listed.values())) == len(listed)
    assert not set(ALIASES) & set(listed)  # an old id is no second entry


@pytest.mark.parametrize("old", sorted(ALIASES))
def test_every_old_id_resolves_to_the_class_of_its_new_id(old):
    new = ALIASES[old]
    assert canonical_name(old) == new
    assert method_class(old) is method_class(new) is methods()[new]
    assert method_class(old).name == new


def test_an_unknown_id_lists_the_new_ids():
    with pytest.raises(ValueError, match="mh-pfedhn") as caught:
        method_class("mh_pfedhn_typo")
    assert "mh_pfedhn," not in str(caught.value)
