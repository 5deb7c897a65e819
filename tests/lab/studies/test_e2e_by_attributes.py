"""The E2E breakdown by attribute count (lab/studies/e2e_by_attributes.py): the grouping and the
near-place count it reports. Fast: no model."""

from model.tasks.e2e import E2ERecord


def by_attributes():
    from lab.studies import e2e_by_attributes

    return e2e_by_attributes


RECORDS = [
    E2ERecord("name[Aromi], eatType[pub], near[Burger King]", ("Aromi is a pub near Burger King.",)),
    E2ERecord("name[Zizzi], food[French]", ("Zizzi serves French food.",)),
    E2ERecord("name[Bibimbap House], area[riverside], near[Express by Holiday Inn]", ("x",)),
]


def test_mrs_are_grouped_by_how_many_attributes_they_name():
    assert by_attributes().groups_by_attribute_count(RECORDS) == {2: [1], 3: [0, 2]}


def test_the_near_place_counts_only_when_written_word_for_word_and_only_where_asked():
    script = by_attributes()
    outputs = ["Aromi is a pub near Burger King.", "Zizzi is near Burger King.", "Bibimbap House is near Express."]
    assert script.near_named(outputs, RECORDS, [0, 1, 2]) == (1, 2)
    assert script.near_named(outputs, RECORDS, [1]) == (0, 0)


def test_near_places_are_grouped_most_frequent_first_and_the_devset_places_are_known():
    script = by_attributes()
    assert script.near_place_rows(RECORDS) == {"Burger King": [0], "Express by Holiday Inn": [2]}
    places = script.devset_places()
    assert {"Crowne Plaza Hotel", "Burger King"} <= places and "All Bar One" not in places


def test_made_up_facts_are_counted_per_attribute_the_mr_does_not_give():
    script = by_attributes()
    outputs = ["Aromi is a pub near Burger King. Its customer rating is average.",  # a rating made up
               "Zizzi serves French food.", "Bibimbap House is a riverside pub near Express by Holiday Inn."]
    added, clean = script.made_up_counts(outputs, RECORDS)
    assert added == {"customer rating": 1, "eatType": 1} and clean == 1
