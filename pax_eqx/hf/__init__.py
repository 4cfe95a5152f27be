"""Hugging Face checkpoints in and out (`python -m pax_eqx.import_hf`, `python -m pax_eqx.export_hf`).

families.py          config.json -> LanguageModelConfig (every field mapped, inert or refused)
safetensors_files.py the tensors of a checkpoint directory, memory-mapped one at a time
weights.py           HF tensor names and layouts <-> pax_eqx parameter names, per family
streaming.py         parameters read straight into their shardings
state.py             a step-0 TrainState around given parameters
importer.py          a HF directory -> experiment + parameters
exporter.py          parameters -> a HF directory
"""
