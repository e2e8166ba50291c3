"""prepare_multihopqa: official release shapes -> TFDS ArrayRecord -> grain, compared with the source rows."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent_r1_jax import paths
from agent_r1_jax.data import corpus_builder, loader, prompts, sources, tfds_store
from agent_r1_jax.data.prepare_multihopqa import mix_train, prepare
from agent_r1_jax.retrieval import load_corpus


def _official_row(i: int, answer="ans", question="Q?") -> dict:
  return {"_id": f"h{i}", "question": question, "answer": answer, "type": "bridge", "level": "easy",
          "supporting_facts": [[f"T{i}a", 0], [f"T{i}b", 1], [f"T{i}a", 1]],
          "context": [[f"T{i}a", ["First sentence.", " Second one."]], [f"T{i}b", ["Only.", " Two."]],
                      [f"D{i}", ["Distractor."]]]}


@pytest.fixture(scope="module")
def release_dir(tmp_path_factory):
  """Official-shape fixtures (HotpotQA, 2Wiki incl. aliases, MuSiQue) with deliberately malformed rows."""
  d = tmp_path_factory.mktemp("releases")
  hotpot = [_official_row(i, answer=f"answer {i}", question=f"Question {i}?") for i in range(6)]
  hotpot.append(_official_row(90, answer=""))  # missing answer
  hotpot.append(_official_row(91, question="  "))  # empty question
  (d / "hotpot_train_v1.1.json").write_text(json.dumps(hotpot))
  wiki = [{"_id": f"w{i}", "type": "comparison", "question": f"Which is older, A{i} or B{i}?", "answer": f"A{i}",
           "supporting_facts": [[f"A{i}", 0], [f"B{i}", 0]],
           "context": [[f"A{i}", ["A was founded in 1900."]], [f"B{i}", ["B was founded in 1950."]]],
           "evidences": []} for i in range(4)]
  wiki.append({**wiki[0], "_id": "w99"})
  del wiki[-1]["answer"]  # missing answer key
  (d / "train.json").write_text(json.dumps(wiki))
  (d / "dev.json").write_text(json.dumps(wiki[:2]))
  (d / "id_aliases.json").write_text("\n".join(json.dumps({"Q_id": f"w{i}", "aliases": [f"Alias{i}"],
                                                           "demonyms": []}) for i in range(2)))
  musique = [{"id": f"2hop__{i}_{i}", "question": f"Who is {i}?", "answer": f"M{i}", "answer_aliases": [f"Em{i}"],
              "answerable": True, "question_decomposition": [],
              "paragraphs": [{"idx": 0, "title": f"P{i}", "paragraph_text": f"Text {i}.", "is_supporting": True},
                             {"idx": 1, "title": f"N{i}", "paragraph_text": "Noise.", "is_supporting": False}]}
             for i in range(3)]
  musique.append({**musique[0], "id": "2hop__unans", "answerable": False})
  (d / "musique_ans_v1.0_dev.jsonl").write_text("\n".join(json.dumps(r) for r in musique) + "\n")
  return d


def test_official_shapes_malformed_rows_and_aliases(release_dir, tmp_path):
  report = prepare(hotpotqa_train=str(release_dir / "hotpot_train_v1.1.json"),
                   twowiki_train=str(release_dir / "train.json"), twowiki_dev=str(release_dir / "dev.json"),
                   twowiki_aliases=str(release_dir / "id_aliases.json"),
                   musique_dev=str(release_dir / "musique_ans_v1.0_dev.jsonl"), output_dir=tmp_path, train_size=8)
  hotpot_read = report.reads[0]
  assert sorted(hotpot_read.skipped) == [("h90", "missing answer"), ("h91", "empty question")]
  assert report.reads[1].skipped == [("w99", "missing answer")]
  assert report.reads[3].unanswerable == 1
  text = "\n".join(report.lines())
  assert "8 rows, 6 kept, 2 skipped" in text and "skipped h90: missing answer" in text
  assert "1 unanswerable left out" in text
  assert report.split_sizes == {"train": 8, "validation_2wikimultihopqa": 2, "validation_musique": 3}
  assert report.train_composition == {"2wikimultihopqa": 4, "hotpotqa": 4}

  train = {e["id"]: e for e in tfds_store.load_split(tmp_path, "multihopqa", "train")}
  h1 = train.get("h1") or next(e for e in train.values() if e["data_source"] == "hotpotqa")
  source = _official_row(int(h1["id"][1:]), answer=f"answer {h1['id'][1:]}", question=f"Question {h1['id'][1:]}?")
  assert h1["question"] == source["question"] and h1["answers"] == [source["answer"]]
  assert h1["supporting_titles"] == [source["supporting_facts"][0][0], source["supporting_facts"][1][0]]
  assert h1["contexts"][0] == {"title": source["context"][0][0], "text": "First sentence. Second one."}
  assert h1["type"] == "bridge"
  dev = list(tfds_store.load_split(tmp_path, "multihopqa", "validation_2wikimultihopqa"))
  assert [e["answers"] for e in dev] == [["A0", "Alias0"], ["A1", "Alias1"]]
  assert dev[0]["contexts"][1] == {"title": "B0", "text": "B was founded in 1950."}
  mus = list(tfds_store.load_split(tmp_path, "multihopqa", "validation_musique"))
  assert [e["id"] for e in mus] == ["2hop__0_0", "2hop__1_1", "2hop__2_2"]
  assert mus[1]["answers"] == ["M1", "Em1"] and mus[1]["supporting_titles"] == ["P1"] and mus[1]["type"] == "2hop"


def test_shared_release_files_match_source_rows(shared_data, tmp_path):
  hf_path = shared_data / "hotpotqa" / "rpt_hotpot_dev_distractor_300a.jsonl"
  hf_rows = [json.loads(l) for l in hf_path.read_text().splitlines() if l.strip()]
  pq.write_table(pa.Table.from_pylist(hf_rows[:40]), tmp_path / "hotpot_qa_train.parquet")
  mus_path = shared_data / "musique" / "hipporag_musique_ans_train_100.json"
  wiki_qa_path = shared_data / "2wikimultihopqa" / "r1searcher_2wiki_dev_500_qa.jsonl"
  report = prepare(hotpotqa_train=str(tmp_path / "hotpot_qa_train.parquet"), hotpotqa_dev=str(hf_path),
                   twowiki_dev=str(wiki_qa_path), musique_dev=str(mus_path), output_dir=tmp_path / "out",
                   train_size=None)
  assert [r.row_format for r in report.reads] == ["hf", "hf", "qa", "musique"]

  stored = list(tfds_store.load_split(tmp_path / "out", "multihopqa", "validation_hotpotqa"))
  assert len(stored) == len(hf_rows) == 300
  for ex, row in zip(stored, hf_rows):  # reference mapping written out here, field by field
    assert ex["id"] == row["id"] and ex["question"] == row["question"].strip()
    assert ex["answers"] == [row["answer"]] and ex["type"] == row["type"]
    assert ex["supporting_titles"] == list(dict.fromkeys(row["supporting_facts"]["title"]))
    assert [c["title"] for c in ex["contexts"]] == row["context"]["title"]
    assert [c["text"] for c in ex["contexts"]] == ["".join(s).strip() for s in row["context"]["sentences"]]
  assert sorted(e["id"] for e in tfds_store.load_split(tmp_path / "out", "multihopqa", "train")) == \
      sorted(r["id"] for r in hf_rows[:40])

  mus_rows = json.loads(mus_path.read_text())
  mus = list(tfds_store.load_split(tmp_path / "out", "multihopqa", "validation_musique"))
  answerable = [r for r in mus_rows if r.get("answerable", True)]
  assert len(mus) == len(answerable)
  for ex, row in zip(mus, answerable):
    assert ex["answers"][0] == row["answer"] and set(row["answer_aliases"]) <= set(ex["answers"])
    assert ex["supporting_titles"] == list(dict.fromkeys(p["title"] for p in row["paragraphs"] if p["is_supporting"]))
    assert [c["text"] for c in ex["contexts"]] == [p["paragraph_text"].strip() for p in row["paragraphs"]]

  wiki_rows = [json.loads(l) for l in wiki_qa_path.read_text().splitlines() if l.strip()]
  wiki = list(tfds_store.load_split(tmp_path / "out", "multihopqa", "validation_2wikimultihopqa"))
  assert [(e["id"], e["question"], e["answers"]) for e in wiki] == \
      [(str(r["idx"]), r["question"].strip(), [r["answer"]]) for r in wiki_rows]


def test_prompts_with_the_real_qwen_tokenizer(qwen_tokenizer_dir, shared_data, tmp_path):
  import transformers
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir))
  text = prompts.render_prompt(tokenizer, "Who wrote Hamlet?", [prompts.search_tool_schema()])
  assert "<tools>\n" in text and '"name": "search"' in text and "</tools>" in text
  assert "<|im_start|>user\nQuestion: Who wrote Hamlet?\n" in text and "<answer>" in text
  assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
  report = prepare(hotpotqa_dev=str(shared_data / "hotpotqa" / "rpt_hotpot_dev_distractor_300a.jsonl"),
                   output_dir=tmp_path, tokenizer=tokenizer)
  stats = report.prompt_tokens["validation_hotpotqa"]
  print("Qwen2.5 prompt tokens, HotpotQA dev 300:", {k: round(v, 1) for k, v in stats.items()})
  assert stats["count"] == 300 and 150 < stats["min"] <= stats["mean"] <= stats["max"] < 600
  assert any(line.startswith("prompt tokens validation_hotpotqa") for line in report.lines())


def test_search_tool_schema_matches_the_tool():
  from agent_r1_jax.retrieval import BM25Index, Passage
  from agent_r1_jax.tools import WikiSearchTool
  tool = WikiSearchTool(BM25Index([Passage("0", "t", "x")]))
  assert prompts.search_tool_schema() == tool.tool_schema


def test_train_mix_is_equal_and_seeded():
  pools = {"a": [{"id": f"a{i}", "data_source": "a"} for i in range(50)],
           "b": [{"id": f"b{i}", "data_source": "b"} for i in range(30)]}
  mixed = mix_train(pools, 41, seed=0)
  assert sum(e["data_source"] == "a" for e in mixed) == 21 and len({e["id"] for e in mixed}) == 41
  assert [e["id"] for e in mix_train(pools, 41, seed=0)] == [e["id"] for e in mixed]
  assert [e["id"] for e in mix_train(pools, 41, seed=1)] != [e["id"] for e in mixed]
  assert len(mix_train(pools, 100, seed=0)) == 80  # a pool smaller than its share gives everything


def test_grain_iteration_is_seeded_and_resumable(release_dir, tmp_path):
  prepare(hotpotqa_train=str(release_dir / "hotpot_train_v1.1.json"), twowiki_train=str(release_dir / "train.json"),
          output_dir=tmp_path, train_size=None)
  source = tfds_store.load_split(tmp_path, "multihopqa", "train")
  ids = sorted(e["id"] for e in source)
  assert len(ids) == 10

  def take(it, n):
    return [[e["id"] for e in next(it)] for _ in range(n)]

  first = take(loader.example_iterator(source, batch_size=5, seed=7), 4)
  assert sorted(first[0] + first[1]) == ids and sorted(first[2] + first[3]) == ids  # each epoch a permutation
  assert first[:2] != first[2:]  # reshuffled per epoch
  assert take(loader.example_iterator(source, batch_size=5, seed=7), 4) == first
  assert take(loader.example_iterator(source, batch_size=5, seed=8), 2) != first[:2]
  it = loader.example_iterator(source, batch_size=3, seed=7)
  take(it, 2)
  state = it.get_state()
  expected = take(it, 3)
  resumed = loader.example_iterator(source, batch_size=3, seed=7)
  resumed.set_state(state)
  assert take(resumed, 3) == expected
  shards = [[e["id"] for b in loader.example_iterator(source, batch_size=1, num_epochs=1, shard_index=k,
                                                       shard_count=2) for e in b] for k in range(2)]
  assert not set(shards[0]) & set(shards[1]) and sorted(shards[0] + shards[1]) == ids


def test_corpus_builder(release_dir, tmp_path):
  prepare(hotpotqa_dev=str(release_dir / "hotpot_train_v1.1.json"), output_dir=tmp_path)
  count = corpus_builder.build_from_prepared(tmp_path, ["validation_hotpotqa"], tmp_path / "corpus.jsonl")
  passages = load_corpus(str(tmp_path / "corpus.jsonl"))
  assert count == len(passages) == 6 * 3
  assert {(p.title, p.text) for p in passages} >= {("T2a", "First sentence. Second one."), ("D5", "Distractor.")}
  with pytest.raises(ValueError, match="no context paragraphs"):
    corpus_builder.write_corpus([{"contexts": []}], tmp_path / "empty.jsonl")


def test_bad_input_messages(release_dir, tmp_path):
  with pytest.raises(ValueError, match="at least one input file"):
    prepare(output_dir=tmp_path)
  with pytest.raises(ValueError, match="data file not found"):
    prepare(hotpotqa_dev=str(tmp_path / "nope.json"), output_dir=tmp_path)
  (tmp_path / "odd.jsonl").write_text(json.dumps({"foo": 1}) + "\n")
  with pytest.raises(ValueError, match="unrecognised row shape"):
    prepare(hotpotqa_dev=str(tmp_path / "odd.jsonl"), output_dir=tmp_path)
  prepare(hotpotqa_dev=str(release_dir / "hotpot_train_v1.1.json"), output_dir=tmp_path)
  with pytest.raises(ValueError, match="already exists"):
    prepare(hotpotqa_dev=str(release_dir / "hotpot_train_v1.1.json"), output_dir=tmp_path)
  with pytest.raises(ValueError, match="no split 'train'"):
    tfds_store.load_split(tmp_path, "multihopqa", "train")
  with pytest.raises(ValueError, match="no prepared dataset"):
    tfds_store.load_split(tmp_path, "hotpot", "train")
  with pytest.raises(ValueError, match="data_source"):
    sources.read_source(release_dir / "dev.json", "squad")


def test_cli_reports_counts(release_dir, tmp_path):
  env = {**os.environ, "AGENT_R1_CACHE": str(tmp_path / "cache")}
  cmd = [sys.executable, "-m", "agent_r1_jax.data.prepare_multihopqa",
         f"--hotpotqa_train={release_dir / 'hotpot_train_v1.1.json'}", f"--twowiki_dev={release_dir / 'dev.json'}",
         f"--musique_dev={release_dir / 'musique_ans_v1.0_dev.jsonl'}", "--train_size=4",
         f"--corpus_output={tmp_path / 'corpus.jsonl'}"]
  out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=paths.REPO_ROOT)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "8 rows, 6 kept, 2 skipped" in out.stdout and "skipped h91: empty question" in out.stdout
  assert "split train: 4 examples (hotpotqa 4)" in out.stdout
  assert "corpus: 10 passages" in out.stdout  # 2Wiki dev: 2 x 2 paragraphs, MuSiQue dev: 3 x 2
  assert (tmp_path / "cache" / "datasets" / "multihopqa" / "1.0.0" / "dataset_info.json").exists()
  bad = subprocess.run(cmd[:3] + [f"--hotpotqa_dev={tmp_path / 'missing.json'}"], env=env, capture_output=True,
                       text=True, timeout=120, cwd=paths.REPO_ROOT)
  assert bad.returncode != 0 and "data file not found" in bad.stderr


def test_held_out_questions_and_a_corpus_for_training(release_dir, tmp_path):
  """Catches a dev question that is also a train question staying in its validation split (held-out numbers on
  trained questions), and a corpus without the train paragraphs (RL on questions whose passages cannot be found)."""
  train_rows = [_official_row(i, answer=f"answer {i}", question=f"Question {i}?") for i in range(4)]
  dev_rows = [_official_row(i + 10, answer=f"answer {i}", question=f"  question {i}? ") for i in range(2, 6)]
  (tmp_path / "train.json").write_text(json.dumps(train_rows))
  (tmp_path / "dev.json").write_text(json.dumps(dev_rows))
  kwargs = dict(hotpotqa_train=str(tmp_path / "train.json"), hotpotqa_dev=str(tmp_path / "dev.json"),
                train_size=None, overwrite=True)
  kept = prepare(output_dir=tmp_path / "plain", corpus_output=tmp_path / "plain.jsonl", **kwargs)
  assert kept.split_sizes == {"train": 4, "validation_hotpotqa": 4} and kept.dropped_overlap == {}
  plain_titles = {p.title for p in load_corpus(str(tmp_path / "plain.jsonl"))}
  assert "T12a" in plain_titles and not plain_titles & {"T0a", "T0b", "D0"}  # default: validation paragraphs only
  report = prepare(output_dir=tmp_path / "held", corpus_output=tmp_path / "held.jsonl", corpus_with_train=True,
                   drop_dev_overlap=True, **kwargs)
  # Dev questions 2 and 3 are train questions 2 and 3 up to case and spacing; 4 and 5 are new.
  assert report.split_sizes == {"train": 4, "validation_hotpotqa": 2}
  assert report.dropped_overlap == {"validation_hotpotqa": 2}
  assert any("2 questions also in train left out" in line for line in report.lines())
  held = tfds_store.load_split(tmp_path / "held", "multihopqa", "validation_hotpotqa")
  assert sorted(e["question"].strip() for e in held) == ["question 4?", "question 5?"]
  titles = {p.title for p in load_corpus(str(tmp_path / "held.jsonl"))}
  assert {"T0a", "T0b", "D0", "T3a"} <= titles and {"T14a", "D15"} <= titles and "T12a" not in titles


def test_a_cached_preset_dataset_is_prepared_again_from_other_files(tmp_path):
  """A preset's `data.prepare.*` files are prepared once into `<cache>/datasets/<name>`: naming the same files
  reuses it, naming other files under the same name prepares it again (not training on the old questions)."""
  from agent_r1_jax.trainer import assets, config as config_lib  # pylint: disable=import-outside-toplevel
  for name, offset in (("a", 0), ("b", 100), ("dev", 50)):
    rows = [_official_row(offset + i, answer=f"answer {offset + i}", question=f"Question {offset + i}?")
            for i in range(3)]
    (tmp_path / f"{name}.json").write_text(json.dumps(rows))

  def train_questions(train_file: str) -> tuple[list[str], float]:
    c = config_lib.base_config("grpo", "smollm2-135m")
    with c.unlocked():
      c.data.prepare.update(dict(hotpotqa_train=str(tmp_path / train_file), hotpotqa_dev=str(tmp_path / "dev.json")))
      assets.resolve_data(c)
    root = pathlib.Path(c.data.prepared_dir)
    return (sorted(e["question"] for e in tfds_store.load_split(root, "multihopqa", "train")),
            (root / assets.CORPUS_FILE).stat().st_mtime_ns)

  first, written = train_questions("a.json")
  assert first == [f"Question {i}?" for i in range(3)]
  assert train_questions("a.json") == (first, written)  # the same files: the cached dataset, not rewritten
  assert train_questions("b.json")[0] == [f"Question {100 + i}?" for i in range(3)]
