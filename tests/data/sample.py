"""A small inventory module, the sample file for `memosight complete`."""

from dataclasses import dataclass, field


@dataclass
class Item:
    name: str
    price: float
    quantity: int = 0


@dataclass
class Inventory:
    items: dict[str, Item] = field(default_factory=dict)

    def add(self, item: Item) -> None:
        """Add an item, or increase the quantity of one with the same name."""
        if item.name in self.items:
            self.items[item.name].quantity += item.quantity
        else:
            self.items[item.name] = item

    def remove(self, name: str, quantity: int = 1) -> None:
        """Remove some of an item; drop it when none is left."""
        item = self.items[name]
        item.quantity -= quantity
        if item.quantity <= 0:
            del self.items[name]

    def total_value(self) -> float:
        """The value of everything in stock."""
        return sum(item.price * item.quantity for item in self.items.values())

    def names(self) -> list[str]:
        return sorted(self.items)


def main() -> None:
    inventory = Inventory()
    inventory.add(Item("apple", 0.5, 10))
    inventory.add(Item("pear", 0.75, 4))
    print(f"{len(inventory.names())} kinds, worth {inventory.total_value():.2f}")


if __name__ == "__main__":
    main()
