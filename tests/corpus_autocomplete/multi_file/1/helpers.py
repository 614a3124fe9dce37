"""The computation of multi_file, imported relatively by its model.py."""

NAME = "helpers"


def doubled(values):
    return values * 2
