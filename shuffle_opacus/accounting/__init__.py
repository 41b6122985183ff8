"""From a training history to epsilon, without torch: protocols, the ledger and calibration.

The layer between the maths of :mod:`shuffle_opacus.analysis` and everything that trains: the
client-sampling protocols (:mod:`.protocols`), the sensitivity convention (:mod:`.sensitivity`),
a history's epsilon (:mod:`.history`), the ledger of released rounds (:mod:`.ledger`) and the
calibration of the noise to a target (:mod:`.calibration`).
"""
