"""Stage a dataset onto local disk and pre-decode it once: ``invoke stage-data``.

request.py holds the records (what a run is asked, what it did), built from the configuration by options.py;
stage.py runs it: sources.py/transfer.py/archives.py fetch (rsync through ``sh``, HTTP through an injected
requests.Session, safe unpacking), inventory.py scans, run_images.py (images.py, decode.py, finalize.py) or
run_text.py (text.py, text_stage.py) decode, manifest.py describes and verifies; journal.py makes every step
resumable, npyfile.py writes arrays in place, places.py picks the disk and checks the space.
"""
