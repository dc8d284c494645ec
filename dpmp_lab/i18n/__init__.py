"""The course in more than one language, from one source: the English notebooks, and a gettext
catalogue per notebook and language that translates what a learner reads in them (units.py
cuts a notebook into those pieces and puts translations back; catalogue.py keeps the
catalogues in step with the notebooks and writes a notebook in another language)."""

from dpmp_lab.i18n.catalogue import (
    COMMON,
    LANGUAGES,
    NAMES,
    SOURCE,
    catalogue_path,
    language_of,
    load,
    notebook_pieces,
    problems,
    translate,
    translate_source,
    translator,
    update,
)

__all__ = ["COMMON", "LANGUAGES", "NAMES", "SOURCE", "catalogue_path", "language_of", "load",
           "notebook_pieces", "problems", "translate", "translate_source", "translator", "update"]
