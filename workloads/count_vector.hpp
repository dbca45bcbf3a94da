// Token counts in 16 or 32 bits: a routing matrix's cells and an all-to-all's token-slots.
#pragma once
#include <algorithm>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <utility>
#include <vector>

namespace moesim {

/// Token counts, each in 16 bits where the maker knows they fit and in 32 otherwise: a sampled
/// routing's cell is at most its tokens per GPU (a token picks distinct experts), and 16 bits
/// halve the biggest matrices (at 4,096 GPUs twelve layers were 768 MiB of int32, and first
/// touching a page costs this VM more than sampling its counts). Read-only but for widen().
class CountVector {
 public:
  CountVector() = default;
  explicit CountVector(std::vector<std::int32_t> wide) : wide_(std::move(wide)) {}
  explicit CountVector(std::vector<std::uint16_t> narrow) : narrow_(std::move(narrow)), is_narrow_(true) {}
  std::size_t size() const { return is_narrow_ ? narrow_.size() : wide_.size(); }
  bool empty() const { return size() == 0; }
  std::int32_t operator[](std::size_t k) const { return is_narrow_ ? std::int32_t(narrow_[k]) : wide_[k]; }
  bool narrow() const { return is_narrow_; }
  /// f(data pointer) with the counts as stored (const std::uint16_t* or const std::int32_t*): the
  /// way through a whole matrix.
  template <class F>
  [[gnu::always_inline]] decltype(auto) visit(const F& f) const {
    return is_narrow_ ? f(narrow_.data()) : f(wide_.data());
  }
  /// The counts as 32 bits from now on (to be changed in place).
  std::vector<std::int32_t>& widen() {
    if (is_narrow_) {
      wide_.assign(narrow_.begin(), narrow_.end());
      narrow_ = {};
      is_narrow_ = false;
    }
    return wide_;
  }

  /// Read by value, in order (std::copy, range for).
  class Iterator {
   public:
    using iterator_category = std::random_access_iterator_tag;
    using value_type = std::int32_t;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = std::int32_t;
    Iterator() = default;
    Iterator(const CountVector* v, std::size_t k) : v_(v), k_(k) {}
    std::int32_t operator*() const { return (*v_)[k_]; }
    std::int32_t operator[](difference_type d) const { return (*v_)[std::size_t(difference_type(k_) + d)]; }
    Iterator& operator++() { return ++k_, *this; }
    Iterator operator++(int) { return {v_, k_++}; }
    Iterator& operator--() { return --k_, *this; }
    Iterator operator--(int) { return {v_, k_--}; }
    Iterator& operator+=(difference_type d) { return k_ = std::size_t(difference_type(k_) + d), *this; }
    Iterator& operator-=(difference_type d) { return *this += -d; }
    friend Iterator operator+(Iterator a, difference_type d) { return a += d; }
    friend Iterator operator+(difference_type d, Iterator a) { return a += d; }
    friend Iterator operator-(Iterator a, difference_type d) { return a -= d; }
    friend difference_type operator-(const Iterator& a, const Iterator& b) { return difference_type(a.k_) - difference_type(b.k_); }
    friend bool operator==(const Iterator& a, const Iterator& b) { return a.k_ == b.k_; }
    friend auto operator<=>(const Iterator& a, const Iterator& b) { return a.k_ <=> b.k_; }

   private:
    const CountVector* v_ = nullptr;
    std::size_t k_ = 0;
  };
  Iterator begin() const { return {this, 0}; }
  Iterator end() const { return {this, size()}; }
  /// Equal counts, whatever their width.
  friend bool operator==(const CountVector& a, const CountVector& b) {
    if (a.is_narrow_ == b.is_narrow_) return a.is_narrow_ ? a.narrow_ == b.narrow_ : a.wide_ == b.wide_;
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  std::vector<std::uint16_t> narrow_;
  std::vector<std::int32_t> wide_;
  bool is_narrow_ = false;
};

}  // namespace moesim
