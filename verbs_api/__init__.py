"""The pyverbs API over softnic.

Each module here has the name of the pyverbs module it stands for
(``verbs_api.qp`` is ``pyverbs.qp``) and the same classes, constructor
signatures, defaults, properties and return shapes, so that code written for
rdma-core's pyverbs runs unchanged: ``softnic exec`` makes ``import pyverbs``
resolve to these modules for one program.

Objects follow pyverbs' ownership rules: a parent keeps weak references to
its children and closes them when it is closed (a Context closes its PDs,
CQs, completion channels and QPs; a PD its MRs, AHs, QPs and SRQs), and
``close()`` may be called any number of times.  Refused calls raise
``PyverbsRDMAError`` whose ``error_code`` is the errno the kernel would give.
"""
