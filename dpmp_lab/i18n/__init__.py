"""The course in more than one language, from one source: the English notebooks, and a gettext
catalogue per notebook and language that translates what a learner reads in them (units.py
cuts a notebook into those pieces, writing.py puts translations back; catalogue.py keeps the
catalogues in step with the notebooks and writes a notebook in another language); and the
library's own messages in the learner's language (messages.py: `_()`)."""

from dpmp_lab.i18n.catalogue import (
    COMMON,
    HIDDEN,
    LANGUAGES,
    LIKELY_MISTAKE,
    NAMES,
    SOURCE,
    catalogue_path,
    domains,
    lab_settings,
    language_of,
    language_of_folder,
    library_problems,
    load,
    notebook_pieces,
    problems,
    translate,
    translate_source,
    translator,
    update,
    update_library,
)
from dpmp_lab.i18n.messages import LANGUAGE_ENV

__all__ = ["COMMON", "HIDDEN", "LANGUAGES", "LANGUAGE_ENV", "LIKELY_MISTAKE", "NAMES", "SOURCE", "catalogue_path",
           "domains", "lab_settings", "language_of", "language_of_folder", "library_problems", "load",
           "notebook_pieces", "problems", "translate", "translate_source", "translator",
           "update", "update_library"]
