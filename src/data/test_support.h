// Helpers shared by the data tests (header-only; not part of amsp_core).
#pragma once

#include <fstream>
#include <string>

#include "core/test_temp_dir.h"

namespace amsp::data::testing {

// A fresh directory, removed with its contents on destruction.
class TempDir : public amsp::test::TempDir {
 public:
  TempDir() : amsp::test::TempDir("amsp-data-test") {}
};

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Deterministic English-like text: n sentences drawn from a small grammar.
inline std::string sample_text(int sentences, unsigned seed = 1) {
  static const char* subjects[] = {"The cat", "A programmer", "My neighbour", "The old sailor", "Every student",
                                   "The committee", "A quiet river", "The machine"};
  static const char* verbs[] = {"reads", "writes", "forgets", "remembers", "builds", "breaks", "watches",
                                "explains"};
  static const char* objects[] = {"the letter", "a long story", "the broken clock", "seven apples",
                                  "the morning news", "a strange map", "the final answer", "an empty box"};
  static const char* endings[] = {".", " today.", " again.", " with care.", " before dinner.", "!", "?",
                                  " in the garden."};
  static const char* syllable[] = {"ka", "lo", "mi", "ter", "ran", "sol", "vex", "dun",
                                   "pri", "sha", "gor", "bel", "tu", "nim", "qua", "zet"};
  std::string s;
  unsigned x = seed * 2654435761u + 12345u;
  auto next = [&x] {
    x = x * 1664525u + 1013904223u;
    return (x >> 16) & 7u;
  };
  for (int i = 0; i < sentences; ++i) {
    s += subjects[next()];
    s += ' ';
    s += verbs[next()];
    s += ' ';
    s += objects[next()];
    s += " and ";
    for (int k = 0, syllables = 1 + static_cast<int>(next() % 3); k < syllables; ++k)
      s += syllable[(next() << 1 | (next() & 1)) & 15];
    s += endings[next()];
    s += (i % 5 == 4) ? '\n' : ' ';
  }
  return s;
}

}  // namespace amsp::data::testing
